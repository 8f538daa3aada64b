// Package mpscontrol simulates nvidia-cuda-mps-control, NVIDIA's MPS control
// program, for demos and tests. It runs no MPS server and touches no GPU: it
// keeps the control daemon's files, socket and defaults, so that code that
// manages MPS daemons (pkg/sharing) runs unchanged on the simulated machines
// of pkg/nvmlsim. cmd/mps-control-sim is its command; the plugin uses it
// under --simulate in place of the driver root's nvidia-cuda-mps-control.
//
// It has the real tool's interface:
//
//	nvidia-cuda-mps-control -d   start the control daemon in the background
//	                             (in a new session) and return once it
//	                             accepts commands
//	nvidia-cuda-mps-control -f   run the control daemon in the foreground
//	nvidia-cuda-mps-control      control client: send the commands read from
//	                             stdin, one a line, to the daemon and print
//	                             its replies
//
// Like the real tool, the daemon serves the unix socket "control" and writes
// its PID to nvidia-cuda-mps-control.pid in $CUDA_MPS_PIPE_DIRECTORY
// (default /tmp/nvidia-mps), and logs to control.log in
// $CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps): a start line with
// its PID, session and CUDA_VISIBLE_DEVICES, then "Cmd:<command>" for every
// command, as the real control.log does. It knows quit,
// set_default_active_thread_percentage, get_default_active_thread_percentage,
// set_default_device_pinned_mem_limit, get_default_device_pinned_mem_limit and
// get_server_list; it answers any other command with "Invalid command".
//
// Test knobs, read from the environment: SIM_MPS_FAIL_START=1 makes -d fail;
// SIM_MPS_IGNORE_QUIT=1 makes the daemon acknowledge quit without exiting (it
// still exits on SIGTERM).
package mpscontrol

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	// EnvFailStart set to 1 makes -d fail without starting a daemon.
	EnvFailStart = "SIM_MPS_FAIL_START"
	// EnvIgnoreQuit set to 1 makes the daemon acknowledge quit without
	// exiting; it still exits on SIGTERM.
	EnvIgnoreQuit = "SIM_MPS_IGNORE_QUIT"
)

const (
	envPipeDirectory  = "CUDA_MPS_PIPE_DIRECTORY"
	envLogDirectory   = "CUDA_MPS_LOG_DIRECTORY"
	envVisibleDevices = "CUDA_VISIBLE_DEVICES"

	defaultPipeDirectory = "/tmp/nvidia-mps"
	defaultLogDirectory  = "/var/log/nvidia-mps"

	pidFileName    = "nvidia-cuda-mps-control.pid"
	socketName     = "control"
	controlLogName = "control.log"

	// startTimeout bounds how long -d waits for the daemon to accept
	// commands.
	startTimeout = 5 * time.Second
)

// daemonEnv are the variables the daemon reads; -d passes them on from env.
var daemonEnv = []string{envPipeDirectory, envLogDirectory, envVisibleDevices, EnvIgnoreQuit}

// Main runs the simulated nvidia-cuda-mps-control and returns its exit
// status. args is the whole command line: args[0] is the name it was invoked
// as, which the daemon started by -d keeps as its own argv[0]. env looks up
// an environment variable (os.Getenv in a command).
//
// -d starts the daemon by running os.Executable() with "-f" and the
// environment of the current process, with the variables the daemon reads
// taken from env. The daemon inherits stdout and stderr when they are
// *os.File; otherwise its output is discarded.
func Main(args []string, env func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	name := "nvidia-cuda-mps-control"
	if len(args) > 0 {
		name = args[0]
	} else {
		args = []string{name}
	}
	pipeDir := envOr(env, envPipeDirectory, defaultPipeDirectory)
	logDir := envOr(env, envLogDirectory, defaultLogDirectory)
	switch {
	case len(args) == 1:
		return client(pipeDir, stdin, stdout, stderr)
	case len(args) == 2 && args[1] == "-d":
		return background(name, pipeDir, env, stdout, stderr)
	case len(args) == 2 && args[1] == "-f":
		return foreground(pipeDir, logDir, env, stderr)
	default:
		fmt.Fprintln(stderr, "usage: nvidia-cuda-mps-control [-d | -f]")
		return 2
	}
}

func envOr(env func(string) string, name, def string) string {
	if v := env(name); v != "" {
		return v
	}
	return def
}

// client sends stdin to the daemon and prints the replies.
func client(pipeDir string, stdin io.Reader, stdout, stderr io.Writer) int {
	input, err := io.ReadAll(stdin)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	conn, err := net.Dial("unix", filepath.Join(pipeDir, socketName))
	if err != nil {
		fmt.Fprintln(stderr, "Cannot find MPS control daemon process")
		return 1
	}
	defer conn.Close()
	if _, err := conn.Write(input); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	_ = conn.(*net.UnixConn).CloseWrite()
	if _, err := io.Copy(stdout, conn); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// background starts the daemon in a new session and waits until it has
// written its pid file, which it does once it accepts commands.
func background(name, pipeDir string, env func(string) string, stdout, stderr io.Writer) int {
	if env(EnvFailStart) == "1" {
		fmt.Fprintf(stderr, "mps-control-sim: failing to start as %s asks\n", EnvFailStart)
		return 1
	}
	if pid := readPID(pipeDir); pid > 0 && syscall.Kill(pid, 0) == nil {
		fmt.Fprintln(stderr, "An instance of this daemon is already running")
		return 1
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "mps-control-sim: find own executable: %v\n", err)
		return 1
	}
	// Run the executable itself, which works when it is installed as a
	// copy or a symlink under another name, with the name it was invoked
	// as: a caller that recognises the daemon by its argv[0] finds it.
	cmd := exec.Command(exe, "-f")
	cmd.Args[0] = name
	cmd.Env = childEnv(env)
	cmd.Stdout, cmd.Stderr = fileOrNil(stdout), fileOrNil(stderr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "mps-control-sim: start daemon %s: %v\n", exe, err)
		return 1
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(startTimeout)
	for {
		if readPID(pipeDir) == cmd.Process.Pid {
			return 0
		}
		select {
		case err := <-exited:
			fmt.Fprintln(stderr, "mps-control-sim: daemon exited:", err)
			return 1
		case <-deadline:
			fmt.Fprintln(stderr, "mps-control-sim: daemon did not start")
			_ = cmd.Process.Kill()
			return 1
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// childEnv is the daemon's environment: this process's, with the variables
// the daemon reads taken from env.
func childEnv(env func(string) string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(daemonEnv, name) {
			out = append(out, kv)
		}
	}
	for _, name := range daemonEnv {
		if v := env(name); v != "" {
			out = append(out, name+"="+v)
		}
	}
	return out
}

// fileOrNil returns w when it is a file the daemon can inherit, else nil
// (the daemon's output is discarded): a pipe copied by this process would
// outlive Main.
func fileOrNil(w io.Writer) io.Writer {
	if f, ok := w.(*os.File); ok {
		return f
	}
	return nil
}

func readPID(pipeDir string) int {
	data, err := os.ReadFile(filepath.Join(pipeDir, pidFileName))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}
