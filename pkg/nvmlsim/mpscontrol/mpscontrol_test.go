package mpscontrol

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// envRunAsProgram makes the test binary run Main instead of the tests, so
// that the tests can run it as a command, and -d can re-execute it.
const envRunAsProgram = "MPSCONTROL_TEST_RUN_AS_PROGRAM"

func TestMain(m *testing.M) {
	if os.Getenv(envRunAsProgram) == "1" {
		os.Exit(Main(os.Args, os.Getenv, os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// program is the test binary installed the way a simulated driver root
// installs mps-control-sim, as usr/bin/nvidia-cuda-mps-control, with short
// pipe and log directories (unix sockets live in the pipe directory).
type program struct {
	path, pipeDir, logDir string
	env                   []string
}

// install puts the executable at path: as a symlink or as a copy.
type install func(exe, path string) error

func symlinked(exe, path string) error { return os.Symlink(exe, path) }

func copied(exe, path string) error {
	data, err := os.ReadFile(exe)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o755)
}

func newProgram(t *testing.T, env ...string) *program {
	t.Helper()
	return newInstalledProgram(t, symlinked, env...)
}

func newInstalledProgram(t *testing.T, install install, env ...string) *program {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "mpsc")
	if err != nil {
		t.Fatal(err)
	}
	p := &program{
		path:    filepath.Join(dir, "usr", "bin", "nvidia-cuda-mps-control"),
		pipeDir: filepath.Join(dir, "pipe"),
		logDir:  filepath.Join(dir, "log"),
	}
	p.env = append([]string{
		envRunAsProgram + "=1",
		// A race-enabled binary otherwise sleeps a second before it exits.
		"GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"),
		envPipeDirectory + "=" + p.pipeDir,
		envLogDirectory + "=" + p.logDir,
		envVisibleDevices + "=GPU-0c6b4e4a-6f3e-4b5e-9d2f-1a2b3c4d5e6f",
	}, env...)
	if err := os.MkdirAll(filepath.Dir(p.path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := install(exe, p.path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if pid := readPID(p.pipeDir); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		_ = os.RemoveAll(dir)
	})
	return p
}

// run runs the program with args and stdin and returns its exit status and
// output.
func (p *program) run(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(p.path, args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdin = strings.NewReader(stdin)
	// Files, not pipes: the daemon started by -d inherits them.
	stdout, stderr := tempFile(t), tempFile(t)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("run %v: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), readFile(t, stdout.Name()), readFile(t, stderr.Name())
}

// start runs -d and returns the daemon's PID.
func (p *program) start(t *testing.T) int {
	t.Helper()
	if code, _, stderr := p.run(t, "", "-d"); code != 0 {
		t.Fatalf("-d exited with %d: %s", code, stderr)
	}
	pid := readPID(p.pipeDir)
	if pid <= 0 {
		t.Fatal("no pid file after -d")
	}
	return pid
}

// controlLog is control.log without the time stamp prefixes.
func (p *program) controlLog(t *testing.T) []string {
	t.Helper()
	var lines []string
	s := bufio.NewScanner(strings.NewReader(readFile(t, filepath.Join(p.logDir, controlLogName))))
	for s.Scan() {
		_, line, _ := strings.Cut(s.Text(), "] ")
		lines = append(lines, line)
	}
	return lines
}

func tempFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// waitExit waits until process pid is gone, reaped by init or by the
// subreaper.
func waitExit(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("process %d still runs", pid)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(data, ')')
	fields := strings.Fields(string(data[i+1:]))
	return len(fields) == 0 || (fields[0] != "Z" && fields[0] != "X")
}

// TestDaemonLifecycle starts a daemon with -d, installed as a symlink or a
// copy, sends it commands through the client and stops it with quit.
func TestDaemonLifecycle(t *testing.T) {
	for name, install := range map[string]install{"symlink": symlinked, "copy": copied} {
		t.Run(name, func(t *testing.T) { testDaemonLifecycle(t, install) })
	}
}

func testDaemonLifecycle(t *testing.T, install install) {
	p := newInstalledProgram(t, install)
	pid := p.start(t)

	if sid, err := unix.Getsid(pid); err != nil || sid != pid {
		t.Errorf("daemon %d runs in session %d (%v), want its own", pid, sid, err)
	}
	if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil {
		if got := strings.Split(string(cmdline), "\x00"); got[0] != p.path || got[1] != "-f" {
			t.Errorf("daemon command line = %q, want %s -f", got, p.path)
		}
	}
	if _, err := os.Stat(filepath.Join(p.pipeDir, socketName)); err != nil {
		t.Errorf("control socket: %v", err)
	}
	if code, _, stderr := p.run(t, "", "-d"); code != 1 || !strings.Contains(stderr, "already running") {
		t.Errorf("second -d = %d %q, want it refused", code, stderr)
	}

	steps := []struct{ command, reply string }{
		{"get_default_active_thread_percentage", "100.0\n"},
		{"set_default_active_thread_percentage 40", ""},
		{"get_default_active_thread_percentage", "40.0\n"},
		{"set_default_active_thread_percentage 101", "Invalid command: set_default_active_thread_percentage 101\n"},
		{"get_default_device_pinned_mem_limit GPU-a", "0\n"},
		{"set_default_device_pinned_mem_limit GPU-a 2048M", ""},
		{"set_default_device_pinned_mem_limit GPU-a 2048", "Invalid command: set_default_device_pinned_mem_limit GPU-a 2048\n"},
		{"get_default_device_pinned_mem_limit GPU-a", "2048M\n"},
		{"get_server_list", ""},
		{"start_server -uid 0", "Invalid command: start_server -uid 0\n"},
	}
	for _, step := range steps {
		code, stdout, stderr := p.run(t, step.command+"\n")
		if code != 0 || stdout != step.reply {
			t.Errorf("%q: exit %d, reply %q (%s), want %q", step.command, code, stdout, stderr, step.reply)
		}
	}
	// Several commands a connection, as `nvidia-cuda-mps-control <<EOF` sends.
	if _, stdout, _ := p.run(t, "set_default_active_thread_percentage 25\n\nget_default_active_thread_percentage\n"); stdout != "25.0\n" {
		t.Errorf("two commands: reply %q, want 25.0", stdout)
	}

	if code, stdout, stderr := p.run(t, "quit\n"); code != 0 || stdout != "" {
		t.Errorf("quit: exit %d, reply %q (%s)", code, stdout, stderr)
	}
	waitExit(t, pid)
	for _, name := range []string{pidFileName, socketName} {
		if _, err := os.Stat(filepath.Join(p.pipeDir, name)); !os.IsNotExist(err) {
			t.Errorf("%s left after quit: %v", name, err)
		}
	}
	log := p.controlLog(t)
	start := fmt.Sprintf("Starting control daemon pid=%d sid=%d CUDA_VISIBLE_DEVICES=GPU-0c6b4e4a-6f3e-4b5e-9d2f-1a2b3c4d5e6f", pid, pid)
	if len(log) != len(steps)+5 || log[0] != start || log[1] != "Cmd:"+steps[0].command ||
		log[len(log)-2] != "Cmd:quit" || log[len(log)-1] != "Exit" {
		t.Errorf("control.log = %q, want the start line, one Cmd: line a command, then Exit", log)
	}
	if code, _, stderr := p.run(t, "get_server_list\n"); code != 1 || !strings.Contains(stderr, "Cannot find MPS control daemon process") {
		t.Errorf("client without daemon = %d %q", code, stderr)
	}

	// A new daemon in the same directories appends to control.log.
	pid = p.start(t)
	if _, _, stderr := p.run(t, "quit\n"); stderr != "" {
		t.Error(stderr)
	}
	waitExit(t, pid)
	if got := len(p.controlLog(t)); got != len(log)+3 {
		t.Errorf("control.log has %d lines after a second daemon, want %d", got, len(log)+3)
	}
}

// TestFailStart checks SIM_MPS_FAIL_START.
func TestFailStart(t *testing.T) {
	p := newProgram(t, EnvFailStart+"=1")
	code, _, stderr := p.run(t, "", "-d")
	if code != 1 || !strings.Contains(stderr, EnvFailStart) {
		t.Errorf("-d = %d %q, want a failure naming %s", code, stderr, EnvFailStart)
	}
	if _, err := os.Stat(filepath.Join(p.pipeDir, pidFileName)); !os.IsNotExist(err) {
		t.Errorf("pid file after a failed start: %v", err)
	}
}

// TestIgnoreQuit checks SIM_MPS_IGNORE_QUIT: quit is logged and ignored,
// SIGTERM stops the daemon.
func TestIgnoreQuit(t *testing.T) {
	p := newProgram(t, EnvIgnoreQuit+"=1")
	pid := p.start(t)
	if code, _, stderr := p.run(t, "quit\n"); code != 0 {
		t.Fatalf("quit: exit %d: %s", code, stderr)
	}
	time.Sleep(50 * time.Millisecond)
	if !alive(pid) || readPID(p.pipeDir) != pid {
		t.Fatal("daemon exited on quit")
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExit(t, pid)
	if _, err := os.Stat(filepath.Join(p.pipeDir, pidFileName)); !os.IsNotExist(err) {
		t.Errorf("pid file left after SIGTERM: %v", err)
	}
	log := p.controlLog(t)
	if len(log) != 3 || log[1] != "Cmd:quit" || log[2] != "Exit on terminated" {
		t.Errorf("control.log = %q, want quit and then the exit on SIGTERM", log)
	}
}

// TestUsage checks that unknown arguments are refused.
func TestUsage(t *testing.T) {
	for name, args := range map[string][]string{
		"unknown flag":   {"nvidia-cuda-mps-control", "-x"},
		"too many flags": {"nvidia-cuda-mps-control", "-d", "-f"},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := Main(args, func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "usage") {
				t.Errorf("Main(%q) = %d %q, want 2 and the usage", args, code, stderr.String())
			}
		})
	}
}

// TestForegroundInProcess runs the daemon (-f) and clients in this process,
// with the environment passed to Main, so that the race detector sees the
// daemon's concurrency.
func TestForegroundInProcess(t *testing.T) {
	dir, err := os.MkdirTemp("", "mpsc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	vars := map[string]string{
		envPipeDirectory: filepath.Join(dir, "pipe"),
		envLogDirectory:  filepath.Join(dir, "log"),
	}
	env := func(name string) string { return vars[name] }
	var daemonErr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main([]string{"mps-control-sim", "-f"}, env, strings.NewReader(""), &bytes.Buffer{}, &daemonErr)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for readPID(vars[envPipeDirectory]) != os.Getpid() {
		if time.Now().After(deadline) {
			t.Fatal("daemon did not write its pid file")
		}
		time.Sleep(5 * time.Millisecond)
	}

	command := func(input string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := Main([]string{"mps-control-sim"}, env, strings.NewReader(input), &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			uuid := "MIG-" + strconv.Itoa(i)
			limit := strconv.Itoa(i+1) + "G"
			if code, out, stderr := command("set_default_device_pinned_mem_limit " + uuid + " " + limit + "\nget_default_device_pinned_mem_limit " + uuid + "\n"); code != 0 || out != limit+"\n" {
				t.Errorf("%s: exit %d, reply %q (%s), want %s", uuid, code, out, stderr, limit)
			}
		})
	}
	wg.Wait()

	if code, _, stderr := command("quit\n"); code != 0 {
		t.Fatalf("quit: exit %d: %s", code, stderr)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("daemon exited with %d: %s", code, daemonErr.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("daemon did not return after quit")
	}
	if readPID(vars[envPipeDirectory]) != 0 {
		t.Error("pid file left after quit")
	}
}
