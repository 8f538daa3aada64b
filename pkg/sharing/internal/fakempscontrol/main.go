// Command fakempscontrol stands in for nvidia-cuda-mps-control in tests. It
// has the real tool's interface, so the MPS manager runs the same code for
// both:
//
//	fakempscontrol -d   start the control daemon in the background (in a new
//	                    session) and return once it accepts commands
//	fakempscontrol -f   run the control daemon in the foreground
//	fakempscontrol      control client: send the commands read from stdin,
//	                    one a line, to the daemon and print its replies
//
// Like the real tool, the daemon serves the unix socket "control" and writes
// its PID to nvidia-cuda-mps-control.pid in $CUDA_MPS_PIPE_DIRECTORY
// (default /tmp/nvidia-mps), and logs to control.log in
// $CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps): a start line with
// its PID, session and CUDA_VISIBLE_DEVICES, then "Cmd:<command>" for every
// command, as the real control.log does. It knows quit,
// set_default_active_thread_percentage, get_default_active_thread_percentage,
// set_default_device_pinned_mem_limit, get_default_device_pinned_mem_limit and
// get_server_list. It runs no MPS server and touches no GPU.
//
// Test knobs, read from the environment: FAKE_MPS_FAIL_START=1 makes -d fail;
// FAKE_MPS_IGNORE_QUIT=1 makes the daemon acknowledge quit without exiting
// (it still exits on SIGTERM).
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
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

const (
	pidFileName    = "nvidia-cuda-mps-control.pid"
	socketName     = "control"
	controlLogName = "control.log"
)

func main() {
	pipeDir := envOr("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
	logDir := envOr("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
	var code int
	switch {
	case len(os.Args) == 1:
		code = client(pipeDir)
	case len(os.Args) == 2 && os.Args[1] == "-d":
		code = background(pipeDir)
	case len(os.Args) == 2 && os.Args[1] == "-f":
		code = foreground(pipeDir, logDir)
	default:
		fmt.Fprintln(os.Stderr, "usage: nvidia-cuda-mps-control [-d | -f]")
		code = 2
	}
	os.Exit(code)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// client sends stdin to the daemon and prints the replies.
func client(pipeDir string) int {
	input, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	conn, err := net.Dial("unix", filepath.Join(pipeDir, socketName))
	if err != nil {
		fmt.Fprintln(os.Stderr, "Cannot find MPS control daemon process")
		return 1
	}
	defer conn.Close()
	if _, err := conn.Write(input); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_ = conn.(*net.UnixConn).CloseWrite()
	if _, err := io.Copy(os.Stdout, conn); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// background starts the daemon in a new session and waits until it has
// written its pid file, which it does once it accepts commands.
func background(pipeDir string) int {
	if os.Getenv("FAKE_MPS_FAIL_START") == "1" {
		fmt.Fprintln(os.Stderr, "fakempscontrol: failing to start as FAKE_MPS_FAIL_START asks")
		return 1
	}
	if pid := readPID(pipeDir); pid > 0 && syscall.Kill(pid, 0) == nil {
		fmt.Fprintln(os.Stderr, "An instance of this daemon is already running")
		return 1
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cmd := exec.Command(exe, "-f")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(5 * time.Second)
	for {
		if readPID(pipeDir) == cmd.Process.Pid {
			return 0
		}
		select {
		case err := <-exited:
			fmt.Fprintln(os.Stderr, "fakempscontrol: daemon exited:", err)
			return 1
		case <-deadline:
			fmt.Fprintln(os.Stderr, "fakempscontrol: daemon did not start")
			_ = cmd.Process.Kill()
			return 1
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func readPID(pipeDir string) int {
	data, err := os.ReadFile(filepath.Join(pipeDir, pidFileName))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

// daemon is the control daemon's state.
type daemon struct {
	pipeDir     string
	ignoreQuit  bool
	exiting     atomic.Bool
	mu          sync.Mutex
	log         *os.File
	percentage  string
	pinnedLimit map[string]string
}

func foreground(pipeDir, logDir string) int {
	for _, dir := range []string{pipeDir, logDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	logFile, err := os.OpenFile(filepath.Join(logDir, controlLogName), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	d := &daemon{
		pipeDir:     pipeDir,
		ignoreQuit:  os.Getenv("FAKE_MPS_IGNORE_QUIT") == "1",
		log:         logFile,
		percentage:  "100.0",
		pinnedLimit: map[string]string{},
	}
	socket := filepath.Join(pipeDir, socketName)
	_ = os.Remove(socket)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sid, _ := unix.Getsid(0)
	d.logf("Starting control daemon pid=%d sid=%d CUDA_VISIBLE_DEVICES=%s", os.Getpid(), sid, os.Getenv("CUDA_VISIBLE_DEVICES"))
	if err := writePID(pipeDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		sig := <-signals
		d.logf("Exit on %v", sig)
		d.exit(ln)
	}()
	for {
		conn, err := ln.Accept()
		if d.exiting.Load() {
			select {} // exit is on its way
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		go d.serve(conn, ln)
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
	fmt.Fprintf(d.log, "[%s Control %d] %s\n", time.Now().Format("2006-01-02 15:04:05.000"), os.Getpid(), fmt.Sprintf(format, args...))
}

// exit removes the socket and pid file and exits.
func (d *daemon) exit(ln net.Listener) {
	d.exiting.Store(true)
	_ = os.Remove(filepath.Join(d.pipeDir, pidFileName))
	_ = ln.Close()
	_ = d.log.Close()
	os.Exit(0)
}

var (
	percentageRE = regexp.MustCompile(`^([1-9][0-9]?|100)$`)
	limitRE      = regexp.MustCompile(`^[1-9][0-9]*[MG]$`)
)

func (d *daemon) serve(conn net.Conn, ln net.Listener) {
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
			d.exit(ln)
		}
	}
	if err := scanner.Err(); err != nil && !errors.Is(err, net.ErrClosed) {
		fmt.Fprintln(os.Stderr, err)
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
