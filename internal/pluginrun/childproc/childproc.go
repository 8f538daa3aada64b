// Package childproc runs the real kubelet plugin (pkg/nodeplugin.Run) as a child
// process of a test binary, so that tests can kill it with SIGKILL at the
// driver's fault points or at any moment and start it again on the same
// node directories. The test binary doubles as the plugin: its TestMain
// calls RunIfChild first.
package childproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/kubelet"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
)

const (
	envRoot    = "GPU_DRA_CRASH_CHILD_ROOT"
	envCrashAt = "GPU_DRA_CRASH_AT"
	// hitFile, in the root, names the fault point a child killed itself at.
	hitFile = "fault-hit"
	logFile = "plugin.log"
)

// RunIfChild runs the plugin and exits when this process was started by
// Start; otherwise it returns at once. run gets the node's root directory.
func RunIfChild(run func(root string) error) {
	root := os.Getenv(envRoot)
	if root == "" {
		return
	}
	if err := run(root); err != nil {
		fmt.Fprintln(os.Stderr, "plugin:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// CrashAt is the fault point this child must die at ("" for none).
func CrashAt() string { return os.Getenv(envCrashAt) }

// KillAt returns a driver FaultHook that records point in the root's hit
// file and kills the process with SIGKILL when the driver reaches it.
func KillAt(root, point string) func(string) {
	return func(p string) {
		if point == "" || p != point {
			return
		}
		_ = os.WriteFile(filepath.Join(root, hitFile), []byte(p), 0o644)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never return into the next step
	}
}

// Serve runs the plugin until SIGTERM.
func Serve(cfg *nodeplugin.Config) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return nodeplugin.Run(ctx, cfg)
}

// Child is a running plugin process with the kubelet stand-in registered.
type Child struct {
	Kubelet *kubelet.Kubelet
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // Wait's result, set before done is closed
}

// ErrExited is returned by Start when the plugin exited before it registered.
var ErrExited = errors.New("plugin exited before it registered")

// Start runs the plugin on dirs, dying at fault point crashAt (if not
// empty), and waits up to timeout for it to register with the kubelet
// stand-in. The plugin's output is appended to the root's plugin.log.
func Start(dirs pluginrun.Dirs, crashAt string, timeout time.Duration) (*Child, error) {
	return StartBinary(os.Args[0], dirs, crashAt, timeout)
}

// StartBinary is Start with bin, a test binary whose TestMain calls
// RunIfChild (possibly built from another release), as the plugin.
func StartBinary(bin string, dirs pluginrun.Dirs, crashAt string, timeout time.Duration) (*Child, error) {
	c, err := spawnBinary(bin, dirs, crashAt)
	if err != nil {
		return nil, err
	}
	// An early exit (a crash in recovery, a failing start) ends the wait.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-c.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	k, err := kubelet.Register(ctx, dirs.Registrar, timeout)
	if err != nil {
		select {
		case <-c.done:
			return nil, fmt.Errorf("%w (%v)", ErrExited, c.err)
		default:
		}
		_ = c.cmd.Process.Kill()
		<-c.done
		return nil, fmt.Errorf("plugin did not register: %w", err)
	}
	c.Kubelet = k
	return c, nil
}

// StartKilledAfter starts the plugin like Start and kills it with SIGKILL
// after d wherever it is, usually in its start-up recovery. It reports
// whether the plugin had exited by itself before.
func StartKilledAfter(dirs pluginrun.Dirs, crashAt string, d time.Duration) (bool, error) {
	c, err := spawn(dirs, crashAt)
	if err != nil {
		return false, err
	}
	select {
	case <-c.done:
		return true, nil
	case <-time.After(d):
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.done
		return false, nil
	}
}

// Spawn starts the plugin without waiting for it to register: for a start
// that is meant to die at crashAt during recovery (see Child.WaitKilled).
func Spawn(dirs pluginrun.Dirs, crashAt string) (*Child, error) {
	return spawnBinary(os.Args[0], dirs, crashAt)
}

func spawn(dirs pluginrun.Dirs, crashAt string) (*Child, error) {
	return spawnBinary(os.Args[0], dirs, crashAt)
}

func spawnBinary(bin string, dirs pluginrun.Dirs, crashAt string) (*Child, error) {
	_ = os.RemoveAll(dirs.Registrar)
	if err := os.MkdirAll(dirs.Registrar, 0o750); err != nil {
		return nil, err
	}
	log, err := os.OpenFile(filepath.Join(dirs.Root, logFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer func() { _ = log.Close() }()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), envRoot+"="+dirs.Root, envCrashAt+"="+crashAt)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &Child{cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// Pid is the plugin's process ID.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Done is closed once the process exited.
func (c *Child) Done() <-chan struct{} { return c.done }

// WaitKilled waits up to timeout for the plugin to die by SIGKILL (its
// fault hook's) and says how it ended otherwise.
func (c *Child) WaitKilled(timeout time.Duration) error {
	select {
	case <-c.done:
		if c.Kubelet != nil {
			_ = c.Kubelet.Close()
		}
		if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			return fmt.Errorf("plugin exited with %v, not killed", c.cmd.ProcessState)
		}
		return nil
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("plugin still running after %s", timeout)
	}
}

// Kill kills the plugin with SIGKILL and waits for it.
func (c *Child) Kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
	_ = c.Kubelet.Close()
}

// Stop asks the plugin to stop with SIGTERM and reports how it exited.
func (c *Child) Stop() error {
	defer func() { _ = c.Kubelet.Close() }()
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		if c.err != nil {
			return fmt.Errorf("plugin exited with %w after SIGTERM", c.err)
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.done
		return errors.New("plugin ignored SIGTERM for 30s")
	}
}

// Log returns the output of all plugin processes run on dirs.
func Log(dirs pluginrun.Dirs) string {
	data, _ := os.ReadFile(filepath.Join(dirs.Root, logFile))
	return string(data)
}

// TakeHit returns the fault point a child killed itself at since the last
// call, if any.
func TakeHit(dirs pluginrun.Dirs) (string, bool) {
	path := filepath.Join(dirs.Root, hitFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	_ = os.Remove(path)
	return string(data), true
}
