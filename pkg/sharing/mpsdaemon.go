package sharing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// Files of nvidia-cuda-mps-control in CUDA_MPS_PIPE_DIRECTORY and
// CUDA_MPS_LOG_DIRECTORY.
const (
	// pidFileName holds the control daemon's PID; the daemon writes it.
	pidFileName = "nvidia-cuda-mps-control.pid"
	// controlSocketName is the unix socket the daemon accepts commands on.
	controlSocketName = "control"
)

// pollInterval is how often daemon start and exit are checked.
const pollInterval = 20 * time.Millisecond

// devicePaths are a device's files under MPSOptions.Dir.
type devicePaths struct {
	dir   string // <Dir>/<name>
	state string // <Dir>/<name>/state.json
	pipe  string // <Dir>/<name>/pipe: CUDA_MPS_PIPE_DIRECTORY
	log   string // <Dir>/<name>/log: CUDA_MPS_LOG_DIRECTORY
	shm   string // <Dir>/<name>/shm: tmpfs, /dev/shm of daemon and clients
}

func pathsIn(dir string) devicePaths {
	return devicePaths{
		dir:   dir,
		state: filepath.Join(dir, "state.json"),
		pipe:  filepath.Join(dir, "pipe"),
		log:   filepath.Join(dir, "log"),
		shm:   filepath.Join(dir, "shm"),
	}
}

// daemonStatus reports the control daemon of a pipe directory: its PID (0
// when none is known), whether that process is running and is this
// directory's control daemon, and whether its control socket accepts
// connections. known is the PID the plugin recorded in its own state (0:
// none); the pid file the daemon writes is only a fallback, for a daemon
// the plugin has not recorded yet. Neither is trusted blindly: the process
// must be the control daemon of this very pipe directory (isControlProcess),
// so a forged pid file never makes the plugin signal another process, e.g.
// another GPU's daemon.
func (m *MPSManager) daemonStatus(p devicePaths, known int) (pid int, running, responsive bool) {
	candidates := []int{known}
	if data, err := os.ReadFile(filepath.Join(p.pipe, pidFileName)); err == nil {
		if filePID, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			candidates = append(candidates, filePID)
		}
	}
	for _, c := range candidates {
		if c > 0 && processRunning(c) && m.isControlProcess(c, p.pipe) {
			pid, running = c, true
			break
		}
	}
	if !running {
		return 0, false, false
	}
	conn, err := net.DialTimeout("unix", filepath.Join(p.pipe, controlSocketName), time.Second)
	if err != nil {
		return pid, true, false
	}
	_ = conn.Close()
	return pid, true, true
}

// isControlProcess reports whether process pid is the control daemon of
// pipeDir: it runs the control binary (a PID reused after a reboot is not)
// and its environment names pipeDir (the daemon of another device is not).
// Without /proc it trusts the PID.
func (m *MPSManager) isControlProcess(pid int, pipeDir string) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) || !procMounted()
	}
	argv0, _, _ := strings.Cut(string(data), "\x00")
	if filepath.Base(argv0) != filepath.Base(m.opts.ControlBinary) {
		return false
	}
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	return slices.Contains(strings.Split(string(environ), "\x00"), envMPSPipeDirectory+"="+pipeDir)
}

func procMounted() bool {
	_, err := os.Stat("/proc/self/stat")
	return err == nil
}

// processRunning reports whether process pid exists and is not a zombie.
func processRunning(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// "pid (comm) state ppid ...": comm may contain spaces and parentheses.
	i := bytes.LastIndexByte(data, ')')
	fields := strings.Fields(string(data[i+1:]))
	if i < 0 || len(fields) < 2 || (fields[0] != "Z" && fields[0] != "X") {
		return true
	}
	// A daemon whose parent exited is re-parented to init, which reaps it,
	// or to the plugin when it runs as PID 1 of a container: then the
	// plugin has to reap it.
	if os.Getpid() == 1 && fields[1] == "1" {
		var ws syscall.WaitStatus
		_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
	return false
}

// clientEnv is the environment of a control client that talks to the
// device's daemon: the plugin's, MPSOptions.Env and the daemon's directories.
func (m *MPSManager) clientEnv(p devicePaths) []string {
	return append(pluginEnv(), m.mpsEnv(p)...)
}

func (m *MPSManager) mpsEnv(p devicePaths) []string {
	return append(slices.Clone(m.opts.Env), envMPSPipeDirectory+"="+p.pipe, envMPSLogDirectory+"="+p.log)
}

// daemon describes the daemon of the device whose files are at p; dev is
// zero for a leftover daemon of an unknown device.
func (m *MPSManager) daemon(dev DeviceRef, p devicePaths) Daemon {
	name := filepath.Base(p.dir)
	host := pathsIn(filepath.Join(m.opts.HostDir, name))
	d := Daemon{
		Name: name, Device: dev, Binary: m.opts.ControlBinary,
		Env:     m.mpsEnv(p),
		PipeDir: p.pipe, LogDir: p.log,
		HostPipeDir: host.pipe, HostLogDir: host.log,
	}
	if m.opts.ShmSize > 0 {
		d.HostShmDir = host.shm
	}
	if dev.UUID != "" {
		d.Env = append(d.Env, envVisibleDevices+"="+dev.UUID)
	}
	return d
}

// startDaemon starts the device's daemon with the launcher and waits until
// it accepts commands. Stale files of a dead daemon are removed first.
func (m *MPSManager) startDaemon(ctx context.Context, dev DeviceRef, p devicePaths) (int, error) {
	// Empty the pipe directory but keep it: running containers bind-mount
	// this very directory, and a daemon restarted after a plugin restart
	// must be reachable through their mounts.
	if err := emptyDir(p.pipe); err != nil {
		return 0, fmt.Errorf("clean MPS pipe directory: %w", err)
	}
	for _, dir := range []string{p.pipe, p.log} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return 0, fmt.Errorf("create MPS directory: %w", err)
		}
	}
	if err := m.ensureShm(p); err != nil {
		return 0, err
	}
	d := m.daemon(dev, p)
	ctx, cancel := context.WithTimeoutCause(ctx, m.opts.StartTimeout,
		fmt.Errorf("MPS control daemon did not accept commands on %s within %v", filepath.Join(p.pipe, controlSocketName), m.opts.StartTimeout))
	defer cancel()
	err := m.opts.Launcher.Launch(ctx, d)
	inspector, _ := m.opts.Launcher.(DaemonInspector)
	var status string
	for next := time.Now(); err == nil; {
		pid, running, responsive := m.daemonStatus(p, 0)
		if responsive {
			return pid, nil
		}
		if inspector != nil && time.Now().After(next) {
			next = time.Now().Add(time.Second)
			var fatal bool
			if status, fatal = inspector.Inspect(ctx, d); fatal {
				err = fmt.Errorf("start MPS control daemon: %s", status)
				break
			}
		}
		select {
		case <-time.After(pollInterval):
			continue
		case <-ctx.Done():
		}
		if running {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if status != "" {
			status = " (" + status + ")"
		}
		err = fmt.Errorf("start MPS control daemon: %w%s%s", context.Cause(ctx), status, logTail(filepath.Join(p.log, startLogName)))
	}
	// Leave nothing behind, even when ctx was cancelled.
	cleanupCtx, cancelCleanup := context.WithTimeout(context.WithoutCancel(ctx), m.opts.StopTimeout)
	defer cancelCleanup()
	if cErr := m.opts.Launcher.Cleanup(cleanupCtx, d); cErr != nil {
		err = errors.Join(err, cErr)
	}
	return 0, err
}

// emptyDir removes what dir holds, not dir itself; a missing dir is fine.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// control sends one command to the device's daemon the way an operator does:
// `echo <command> | nvidia-cuda-mps-control` with the daemon's pipe
// directory. It returns what the control client printed.
func (m *MPSManager) control(ctx context.Context, p devicePaths, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.opts.CommandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.opts.ControlBinary)
	cmd.Env = m.clientEnv(p)
	cmd.Stdin = strings.NewReader(command + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	output := strings.TrimSpace(out.String())
	if err != nil {
		if output != "" {
			return output, fmt.Errorf("MPS control command %q: %w: %s", command, err, output)
		}
		return output, fmt.Errorf("MPS control command %q: %w", command, err)
	}
	return output, nil
}

// stopDaemon stops the device's daemon (see terminate; known is its
// recorded PID, 0 if none) and has the launcher remove what it leaves. A
// daemon that is not running is not an error.
func (m *MPSManager) stopDaemon(ctx context.Context, p devicePaths, known int) error {
	if err := m.terminate(ctx, p, known); err != nil {
		return err
	}
	return m.opts.Launcher.Cleanup(ctx, m.daemon(DeviceRef{}, p))
}

// terminate makes the device's daemon exit: `quit`, then SIGTERM and
// SIGKILL.
func (m *MPSManager) terminate(ctx context.Context, p devicePaths, known int) error {
	logger := klog.FromContext(ctx)
	pid, running, _ := m.daemonStatus(p, known)
	if !running {
		return nil
	}
	if _, err := m.control(ctx, p, "quit"); err != nil {
		logger.Info("MPS control daemon did not take quit, terminating it", "pid", pid, "err", err)
	} else if waitExit(ctx, pid, m.opts.StopTimeout) {
		return nil
	} else {
		logger.Info("MPS control daemon did not exit after quit, terminating it", "pid", pid, "timeout", m.opts.StopTimeout)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("signal MPS control daemon %d: %w", pid, err)
		}
		if waitExit(ctx, pid, m.opts.StopTimeout) {
			return nil
		}
	}
	return fmt.Errorf("MPS control daemon %d is still running after SIGKILL", pid)
}

// waitExit waits up to timeout for process pid to exit.
func waitExit(ctx context.Context, pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for processRunning(pid) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(pollInterval)
	}
	return true
}

// logTail returns the end of a log file for an error message.
func logTail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil || len(bytes.TrimSpace(data)) == 0 {
		return ""
	}
	const maxTail = 2000
	if len(data) > maxTail {
		data = data[len(data)-maxTail:]
	}
	return fmt.Sprintf(" (%s: %s)", path, strings.TrimSpace(string(data)))
}
