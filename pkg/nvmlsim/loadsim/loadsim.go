// Package loadsim is the simulated CUDA job behind cmd/gpu-load-sim: a
// process that registers with a simulated machine's process socket
// (ProcessSocket, served by pkg/nvmlsim and mounted into containers of simulated devices) so
// that NVML lists it as a running process with the SM share and memory it
// declares. It holds the registration while it runs, registers again when
// the plugin behind the socket restarts, and can stop and resume its load.
package loadsim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Config is what the load declares and where it registers.
type Config struct {
	// Socket is the simulated driver's process socket.
	Socket string
	// Registration is what is declared.
	Registration Registration
	// Retry is the wait between attempts to reach the socket.
	Retry time.Duration
}

// Main parses args (flags, environment defaults from getenv) and runs the
// load until ctx ends; it returns the exit status. SIGUSR1 stops the load
// (the process unregisters and idles), SIGUSR2 resumes it.
func Main(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := parse(args, getenv, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "gpu-load-sim:", err)
		return 2
	}
	pause := make(chan os.Signal, 1)
	signal.Notify(pause, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(pause)
	running := make(chan bool, 1)
	go func() {
		for s := range pause {
			running <- s == syscall.SIGUSR2
		}
	}()
	if err := Run(ctx, cfg, running, stdout); err != nil {
		fmt.Fprintln(stderr, "gpu-load-sim:", err)
		return 1
	}
	return 0
}

func parse(args []string, getenv func(string) string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", "/"+ProcessSocket, "The simulated driver's process socket.")
	sm := fs.Uint("sm", 50, "Percent of the device's SMs the load keeps busy, 0-100.")
	memory := fs.String("memory", "1Gi", "Device memory the load holds on each device (a quantity: 512Mi, 8Gi).")
	devices := fs.String("devices", getenv("NVIDIA_VISIBLE_DEVICES"), "Comma-separated GPU or MIG UUIDs the load runs on (default: $NVIDIA_VISIBLE_DEVICES).")
	mps := fs.Bool("mps", getenv("CUDA_MPS_PIPE_DIRECTORY") != "", "Run as an MPS client (default: whether $CUDA_MPS_PIPE_DIRECTORY is set).")
	if err := fs.Parse(args[1:]); err != nil {
		return Config{}, err
	}
	if *sm > 100 {
		return Config{}, fmt.Errorf("--sm=%d: must be 0-100", *sm)
	}
	q, err := resource.ParseQuantity(*memory)
	if err != nil || q.Sign() < 0 {
		return Config{}, fmt.Errorf("--memory=%q: want a non-negative quantity such as 8Gi", *memory)
	}
	var uuids []string
	for _, d := range strings.Split(*devices, ",") {
		if d = strings.TrimSpace(d); d != "" {
			uuids = append(uuids, d)
		}
	}
	if len(uuids) == 0 || uuids[0] == "all" || uuids[0] == "void" || uuids[0] == "none" {
		return Config{}, fmt.Errorf("--devices=%q: want GPU or MIG UUIDs (is a GPU claim's device in this container?)", *devices)
	}
	return Config{
		Socket:       *socket,
		Registration: Registration{Devices: uuids, SMPercent: uint32(*sm), MemoryBytes: uint64(q.Value()), MPS: *mps},
		Retry:        2 * time.Second,
	}, nil
}

// Run keeps cfg's load registered until ctx ends. A value on running stops
// (false) or resumes (true) the load. A registration the machine refuses is
// an error; a socket that cannot be reached is retried.
func Run(ctx context.Context, cfg Config, running <-chan bool, log io.Writer) error {
	on := true
	for {
		if !on {
			fmt.Fprintln(log, "Load stopped")
			select {
			case <-ctx.Done():
				return nil
			case on = <-running:
				continue
			}
		}
		err := hold(ctx, cfg, running, &on, log)
		var refused refusedError
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.As(err, &refused):
			return err
		case err != nil && on:
			fmt.Fprintf(log, "Not registered (%v); retrying in %s\n", err, cfg.Retry)
			select {
			case <-ctx.Done():
				return nil
			case on = <-running:
			case <-time.After(cfg.Retry):
			}
		}
	}
}

type refusedError struct{ reason string }

func (e refusedError) Error() string { return "the simulated driver refused the load: " + e.reason }

// hold registers once and returns when the connection ends, ctx ends or
// the load is stopped (*on set to false).
func hold(ctx context.Context, cfg Config, running <-chan bool, on *bool, log io.Writer) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", cfg.Socket)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	line, err := json.Marshal(cfg.Registration)
	if err != nil {
		return err
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write(append(line, '\n')); err != nil {
		return err
	}
	answer, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	if answer = strings.TrimSpace(answer); answer != "ok" {
		return refusedError{reason: strings.TrimPrefix(answer, "error: ")}
	}
	_ = conn.SetDeadline(time.Time{})
	r := cfg.Registration
	fmt.Fprintf(log, "Load running: %d%% SM, %d bytes on %s (mps %t)\n", r.SMPercent, r.MemoryBytes, strings.Join(r.Devices, ","), r.MPS)
	closed := make(chan error, 1)
	go func() {
		_, err := conn.Read(make([]byte, 1))
		closed <- err
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-closed:
			return fmt.Errorf("the simulated driver closed the connection: %w", err)
		case v := <-running:
			if !v {
				*on = false
				return nil
			}
		}
	}
}
