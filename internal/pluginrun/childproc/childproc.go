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
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/kubelet"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const (
	envRoot    = "GPU_DRA_CRASH_CHILD_ROOT"
	envCrashAt = "GPU_DRA_CRASH_AT"
	envPodUID  = "GPU_DRA_CRASH_CHILD_POD_UID"
	envProbe   = "GPU_DRA_CRASH_CHILD_PROBE_ADDRESS"
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

// Pod is one instance of the plugin's DaemonSet pod, for rolling updates:
// instances with distinct UIDs serve side by side on the same directories.
type Pod struct {
	UID string
	// ProbeAddress, when set, serves the instance's probes there.
	ProbeAddress string
}

// ConfigurePod sets this child's pod UID and probe address in cfg, as
// StartPod asked (nothing for a child of Start).
func ConfigurePod(cfg *nodeplugin.Config) {
	cfg.PodUID, cfg.ProbeAddress = os.Getenv(envPodUID), os.Getenv(envProbe)
}

// StartPod runs the plugin as pod on dirs, beside any instance already
// serving there, and waits up to timeout for it to register on its own
// registration socket.
func StartPod(dirs pluginrun.Dirs, pod Pod, timeout time.Duration) (*Child, error) {
	c, err := spawnBinary(os.Args[0], dirs, "", envPodUID+"="+pod.UID, envProbe+"="+pod.ProbeAddress)
	if err != nil {
		return nil, err
	}
	socket := filepath.Join(dirs.Registrar, kubeletplugin.RollingUpdateRegistrarSocketFile(dirs.Registrar, vocabulary.DriverName, types.UID(pod.UID)))
	return c.register(timeout, func(ctx context.Context) (*kubelet.Kubelet, error) {
		return kubelet.RegisterSocket(ctx, socket, timeout)
	})
}

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
	return c.register(timeout, func(ctx context.Context) (*kubelet.Kubelet, error) {
		return kubelet.Register(ctx, dirs.Registrar, timeout)
	})
}

// register waits for the started plugin to register, killing it if it
// does not.
func (c *Child) register(timeout time.Duration, register func(context.Context) (*kubelet.Kubelet, error)) (*Child, error) {
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
	k, err := register(ctx)
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

// spawnBinary starts bin; without a pod UID in env, as the only instance
// (stale registration sockets are removed, as a restarted node's are).
func spawnBinary(bin string, dirs pluginrun.Dirs, crashAt string, env ...string) (*Child, error) {
	if len(env) == 0 {
		_ = os.RemoveAll(dirs.Registrar)
	}
	if err := os.MkdirAll(dirs.Registrar, 0o750); err != nil {
		return nil, err
	}
	log, err := os.OpenFile(filepath.Join(dirs.Root, logFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer func() { _ = log.Close() }()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envRoot+"="+dirs.Root, envCrashAt+"="+crashAt), env...)
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

// journalFile, in the root, lists the fault points children passed.
const journalFile = "journal"

// Step is one fault point a child passed: which process, which step.
type Step struct {
	PID   int
	Point string
}

// Journaling returns a driver FaultHook that appends each step the driver
// takes to the root's journal, then calls next (if set): a record of which
// process mutated the node's state when, across processes.
func Journaling(root string, next func(string)) func(string) {
	path := filepath.Join(root, journalFile)
	return func(point string) {
		if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
			_, _ = fmt.Fprintf(f, "%d %s\n", os.Getpid(), point) // one write: O_APPEND keeps lines whole
			_ = f.Close()
		}
		if next != nil {
			next(point)
		}
	}
}

// Journal returns the steps the children on dirs passed, in order.
func Journal(dirs pluginrun.Dirs) ([]Step, error) {
	data, err := os.ReadFile(filepath.Join(dirs.Root, journalFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var steps []Step
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var s Step
		if _, err := fmt.Sscanf(line, "%d %s", &s.PID, &s.Point); err != nil {
			return nil, fmt.Errorf("journal line %q: %w", line, err)
		}
		steps = append(steps, s)
	}
	return steps, nil
}
