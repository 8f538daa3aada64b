package mpscontrol

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// daemon is the control daemon's state.
type daemon struct {
	pipeDir    string
	ignoreQuit bool
	stderr     io.Writer
	ln         net.Listener
	exiting    atomic.Bool

	mu          sync.Mutex
	log         *os.File // nil once the daemon exits
	percentage  string
	pinnedLimit map[string]string
}

// foreground runs the control daemon until quit or SIGTERM/SIGINT.
func foreground(pipeDir, logDir string, env func(string) string, stderr io.Writer) int {
	for _, dir := range []string{pipeDir, logDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	logFile, err := os.OpenFile(filepath.Join(logDir, controlLogName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	d := &daemon{
		pipeDir:     pipeDir,
		ignoreQuit:  env(EnvIgnoreQuit) == "1",
		stderr:      stderr,
		log:         logFile,
		percentage:  "100.0",
		pinnedLimit: map[string]string{},
	}
	defer d.closeLog()
	socket := filepath.Join(pipeDir, socketName)
	_ = os.Remove(socket)
	d.ln, err = net.Listen("unix", socket)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	sid, _ := unix.Getsid(0)
	d.logf("Starting control daemon pid=%d sid=%d CUDA_VISIBLE_DEVICES=%s", os.Getpid(), sid, env(envVisibleDevices))
	if err := writePID(pipeDir); err != nil {
		_ = d.ln.Close()
		fmt.Fprintln(stderr, err)
		return 1
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(signals)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case sig := <-signals:
			d.logf("Exit on %v", sig)
			d.exit()
		case <-stop:
		}
	}()
	for {
		conn, err := d.ln.Accept()
		if d.exiting.Load() {
			if conn != nil {
				_ = conn.Close()
			}
			return 0
		}
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		go d.serve(conn)
	}
}

func writePID(pipeDir string) error {
	tmp := filepath.Join(pipeDir, "."+pidFileName)
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(pipeDir, pidFileName))
}

func (d *daemon) logf(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.log == nil {
		return
	}
	fmt.Fprintf(d.log, "[%s Control %d] %s\n", time.Now().Format("2006-01-02 15:04:05.000"), os.Getpid(), fmt.Sprintf(format, args...))
}

func (d *daemon) closeLog() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.log != nil {
		_ = d.log.Close()
		d.log = nil
	}
}

// exit removes the pid file and closes the socket (which removes it), so
// that foreground returns. Only the first call does anything.
func (d *daemon) exit() {
	if !d.exiting.CompareAndSwap(false, true) {
		return
	}
	_ = os.Remove(filepath.Join(d.pipeDir, pidFileName))
	_ = d.ln.Close()
}

var (
	percentageRE = regexp.MustCompile(`^([1-9][0-9]?|100)$`)
	limitRE      = regexp.MustCompile(`^[1-9][0-9]*[MG]$`)
)

// serve runs the commands of one client connection, one a line.
func (d *daemon) serve(conn net.Conn) {
	defer conn.Close()
	scanner := bufio.NewScanner(conn)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" {
			continue
		}
		d.logf("Cmd:%s", line)
		reply, quit := d.handle(strings.Fields(line))
		if reply != "" {
			if _, err := fmt.Fprintln(conn, reply); err != nil {
				return
			}
		}
		if quit {
			_ = conn.Close()
			d.logf("Exit")
			d.exit()
			return
		}
	}
	if err := scanner.Err(); err != nil && !errors.Is(err, net.ErrClosed) {
		fmt.Fprintln(d.stderr, err)
	}
}

// handle runs one command and returns the reply and whether to exit.
func (d *daemon) handle(words []string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case words[0] == "quit" && len(words) == 1:
		return "", !d.ignoreQuit
	case words[0] == "get_server_list" && len(words) == 1:
		return "", false
	case words[0] == "set_default_active_thread_percentage" && len(words) == 2 && percentageRE.MatchString(words[1]):
		d.percentage = words[1] + ".0"
		return "", false
	case words[0] == "get_default_active_thread_percentage" && len(words) == 1:
		return d.percentage, false
	case words[0] == "set_default_device_pinned_mem_limit" && len(words) == 3 && limitRE.MatchString(words[2]):
		d.pinnedLimit[words[1]] = words[2]
		return "", false
	case words[0] == "get_default_device_pinned_mem_limit" && len(words) == 2:
		if v, ok := d.pinnedLimit[words[1]]; ok {
			return v, false
		}
		return "0", false
	default:
		return "Invalid command: " + strings.Join(words, " "), false
	}
}
