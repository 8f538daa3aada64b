package sharing

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Daemon is what a DaemonLauncher needs to start one device's MPS control
// daemon. The manager talks to a daemon only through its pipe directory
// (control socket, pid file) and its PID, so where the process lives is the
// launcher's business.
type Daemon struct {
	// Name identifies the device's daemon among the node's daemons; it is
	// the name of the device's directory under MPSOptions.Dir, a short
	// DNS label such as "gpu-3f2a…".
	Name string
	// Device is the GPU or MIG device; zero when only Name is known (a
	// leftover daemon being cleaned up).
	Device DeviceRef
	// Binary is the control program, as the plugin sees it.
	Binary string
	// Env is the daemon's own environment: MPSOptions.Env and the MPS and
	// CUDA variables that select its pipe and log directories and device.
	Env []string
	// PipeDir and LogDir are the daemon's directories as the plugin sees
	// them; HostPipeDir and HostLogDir are the same directories on the host.
	PipeDir, LogDir         string
	HostPipeDir, HostLogDir string
	// HostShmDir, when set, is a tmpfs on the host that the daemon must see
	// at /dev/shm, as its clients do (MPSOptions.ShmSize).
	HostShmDir string
}

// DaemonLauncher starts MPS control daemons and removes what they leave
// behind. Launch returns once the daemon is on its way; the manager then
// waits until it accepts commands and stops it with `quit` and signals (by
// PID: the launcher must leave the daemon in the plugin's PID namespace,
// e.g. the host's). Cleanup is called after the daemon has exited, and for
// daemons the manager never launched; it must be idempotent.
type DaemonLauncher interface {
	Launch(ctx context.Context, d Daemon) error
	Cleanup(ctx context.Context, d Daemon) error
}

// DaemonInspector is a DaemonLauncher that can say why a launched daemon
// is not up yet. While the manager waits for the control socket it asks
// about once a second: a fatal answer (a pod that failed, an image that
// cannot run) ends the wait at once, and the last answer is part of the
// error when the wait times out.
type DaemonInspector interface {
	Inspect(ctx context.Context, d Daemon) (status string, fatal bool)
}

// DaemonPruner is a DaemonLauncher that can remove what daemons of other
// devices than keep (Daemon.Name) left behind, e.g. pods of a teardown that
// crashed. Reconcile calls it last.
type DaemonPruner interface {
	Prune(ctx context.Context, keep []string) error
}

// ProcessLauncher runs daemons as processes of the plugin: `<binary> -d`
// in a new session, so that neither a signal to the plugin's process group
// nor its exit stops them. In a container they still live in the
// container's cgroup and die with it; see pkg/mpspod for daemons that
// outlive the plugin's container.
type ProcessLauncher struct{}

// startLogName collects what `<binary> -d` and the daemon print; the
// daemon's own log is control.log.
const startLogName = "start.log"

// Launch implements DaemonLauncher: it returns when `-d` has returned, or
// with an error when it fails or ctx ends first.
func (ProcessLauncher) Launch(ctx context.Context, d Daemon) error {
	logPath := filepath.Join(d.LogDir, startLogName)
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open MPS start log: %w", err)
	}
	// Files, not pipes: the daemon inherits them and outlives the command,
	// so a pipe would never reach EOF.
	cmd := exec.Command(d.Binary, "-d")
	cmd.Env = append(pluginEnv(), d.Env...)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	_ = out.Close()
	if err != nil {
		return fmt.Errorf("start %s -d: %w", d.Binary, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s -d: %w%s", d.Binary, err, logTail(logPath))
		}
		return nil
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s -d did not return: %w%s", d.Binary, context.Cause(ctx), logTail(logPath))
	}
}

// Cleanup implements DaemonLauncher; a process leaves nothing behind.
func (ProcessLauncher) Cleanup(context.Context, Daemon) error { return nil }

// pluginEnv is the plugin's environment without variables that would
// select other devices or another daemon.
func pluginEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == envVisibleDevices || strings.HasPrefix(name, "CUDA_MPS_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}
