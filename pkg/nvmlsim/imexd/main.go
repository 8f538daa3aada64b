package imexd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CtlName is the control command's name; Main acts as it when invoked by it.
const CtlName = "nvidia-imex-ctl"

// Main runs the simulated nvidia-imex, or nvidia-imex-ctl when args[0]'s base
// name is CtlName, and returns its exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && filepath.Base(args[0]) == CtlName {
		return ctl(args[1:], stdout, stderr)
	}
	return daemonMain(args[min(1, len(args)):], stderr)
}

func daemonMain(args []string, stderr io.Writer) int {
	path, rest, err := configFlag(args)
	if err != nil || len(rest) > 0 {
		fmt.Fprintln(stderr, "usage: nvidia-imex [-c <config path>]")
		return 2
	}
	cfg, err := ReadConfig(path)
	if err != nil {
		fmt.Fprintln(stderr, "nvidia-imex (simulated):", err)
		return 1
	}
	d, err := NewDaemon(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "nvidia-imex (simulated):", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	defer signal.Stop(signals)
	go func() {
		for sig := range signals {
			if sig != syscall.SIGUSR1 {
				cancel()
				return
			}
			if err := d.Reload(); err != nil {
				fmt.Fprintln(stderr, "nvidia-imex (simulated): SIGUSR1:", err)
			}
		}
	}()
	if err := d.Run(ctx, nil); err != nil {
		fmt.Fprintln(stderr, "nvidia-imex (simulated):", err)
		return 1
	}
	return 0
}

// configFlag takes "-c PATH" out of args.
func configFlag(args []string) (string, []string, error) {
	path := DefaultConfigPath
	var rest []string
	for i := 0; i < len(args); i++ {
		if args[i] != "-c" {
			rest = append(rest, args[i])
			continue
		}
		if i+1 == len(args) {
			return "", nil, fmt.Errorf("-c needs a path")
		}
		path = args[i+1]
		i++
	}
	return path, rest, nil
}

func ctl(args []string, stdout, stderr io.Writer) int {
	path, rest, err := configFlag(args)
	if err != nil || len(rest) != 1 || (rest[0] != "-q" && rest[0] != "-N") {
		fmt.Fprintln(stderr, "usage: nvidia-imex-ctl [-c <config path>] <-q|-N> (the simulation has no -i, -u, -n, -s, -d, -m, -H, -j)")
		return 2
	}
	cfg, err := ReadConfig(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if !cfg.CmdEnabled {
		fmt.Fprintf(stderr, "%s: IMEX_CMD_ENABLED is not 1: the command service is off\n", path)
		return 1
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(cfg.BindIP, strconv.Itoa(cfg.CmdPort)), time.Second)
	if err != nil {
		fmt.Fprintln(stderr, "Connection to IMEX daemon failed:", err)
		return 1
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintln(conn, strings.TrimPrefix(rest[0], "-"))
	if _, err := io.Copy(stdout, bufio.NewReader(conn)); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}
