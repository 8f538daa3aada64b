package sharing

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/keyedmutex"
)

// maxSocketPath is the longest unix socket path Linux accepts (108 bytes
// with the terminating NUL).
const maxSocketPath = 107

// maxSocketName is what MPSOptions.Dir must leave room for: MPS creates
// sockets such as "control" and "control_privileged" in the pipe directory.
const maxSocketName = 24

// MPSOptions configure an MPSManager.
type MPSOptions struct {
	// Dir holds one directory per device under MPS, with the daemon's pipe
	// and log directories and a small state file, for example
	// <plugin data dir>/mps. It must be absolute and short: unix sockets
	// live two levels below it, and their paths may not exceed 107 bytes,
	// so Dir may have at most 60 bytes.
	Dir string
	// HostDir is Dir as the host (and so the container runtime) sees it,
	// when the plugin sees it elsewhere; empty means Dir.
	HostDir string
	// ControlBinary is nvidia-cuda-mps-control, normally the driver root's
	// usr/bin/nvidia-cuda-mps-control as the plugin sees it.
	ControlBinary string
	// ComputeModes reads and sets compute modes, normally
	// NewNVMLComputeModes.
	ComputeModes ComputeModes
	// ContainerPipeDir is where containers see the pipe directory; empty
	// means DefaultContainerPipeDir.
	ContainerPipeDir string
	// Env are extra "NAME=value" variables for the control daemon and
	// client, for example an LD_LIBRARY_PATH that finds the driver root's
	// libraries. The client gets them on top of the plugin's environment.
	Env []string
	// Launcher starts the daemons; nil means ProcessLauncher.
	Launcher DaemonLauncher
	// ShmSize, when positive, gives each device a tmpfs of this many bytes
	// that its daemon and clients mount at /dev/shm (mpsshm.go). Only for
	// launchers that can mount it into the daemon, such as pkg/mpspod.
	ShmSize int64
	// StartTimeout bounds starting a daemon until it accepts commands;
	// 0 means 10 seconds.
	StartTimeout time.Duration
	// StopTimeout bounds waiting for a daemon to exit after quit, and
	// after each signal; 0 means 10 seconds.
	StopTimeout time.Duration
	// CommandTimeout bounds one control command; 0 means 10 seconds.
	CommandTimeout time.Duration
}

// MPSManager runs one MPS control daemon per GPU or MIG device shared under
// MPS: it starts the daemon with a device's first share and stops it after
// the last one. It is safe for concurrent use.
type MPSManager struct {
	opts  MPSOptions
	locks keyedmutex.Mutex
}

// mpsState is a device's state file.
type mpsState struct {
	Version    int    `json:"version"`
	UUID       string `json:"uuid"`
	ParentUUID string `json:"parentUUID,omitempty"`
	Index      int    `json:"index"`
	// Shares are the IDs of the device's shares, sorted.
	Shares []string `json:"shares"`
	// Settings are the daemon defaults, from the first share's config.
	Settings mpsSettings `json:"settings"`
	// RestoreComputeMode is the compute mode to set after the last share;
	// nil when the plugin did not change it. It is recorded before the
	// change.
	RestoreComputeMode *int `json:"restoreComputeMode,omitempty"`
	// PID is the daemon's PID when it was last started or adopted. It is
	// what the plugin checks and signals: this file is the plugin's own,
	// while the daemon's pid file lies in the pipe directory that clients
	// see (daemonStatus).
	PID int `json:"pid,omitempty"`
}

func (st *mpsState) device() DeviceRef {
	return DeviceRef{UUID: st.UUID, ParentUUID: st.ParentUUID, Index: st.Index}
}

// NewMPSManager returns a manager that keeps its daemons' files in opts.Dir.
func NewMPSManager(opts MPSOptions) (*MPSManager, error) {
	switch {
	case opts.Dir == "" || !filepath.IsAbs(opts.Dir):
		return nil, fmt.Errorf("MPS: directory %q is not an absolute path", opts.Dir)
	case opts.HostDir != "" && !filepath.IsAbs(opts.HostDir):
		return nil, fmt.Errorf("MPS: host directory %q is not an absolute path", opts.HostDir)
	case opts.ControlBinary == "":
		return nil, errors.New("MPS: no control binary")
	case opts.ComputeModes == nil:
		return nil, errors.New("MPS: no ComputeModes")
	}
	opts.Dir = filepath.Clean(opts.Dir)
	if longest := len(pathsIn(filepath.Join(opts.Dir, dirName("GPU-x"))).pipe) + 1 + maxSocketName; longest > maxSocketPath {
		return nil, fmt.Errorf("MPS: directory %s is too long for the unix sockets MPS creates below it (%d of at most %d bytes); use a path of at most %d bytes",
			opts.Dir, longest, maxSocketPath, len(opts.Dir)-(longest-maxSocketPath))
	}
	if opts.HostDir == "" {
		opts.HostDir = opts.Dir
	}
	if opts.Launcher == nil {
		opts.Launcher = ProcessLauncher{}
	}
	if opts.ContainerPipeDir == "" {
		opts.ContainerPipeDir = DefaultContainerPipeDir
	}
	for _, d := range []*time.Duration{&opts.StartTimeout, &opts.StopTimeout, &opts.CommandTimeout} {
		if *d <= 0 {
			*d = 10 * time.Second
		}
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("MPS: create directory: %w", err)
	}
	return &MPSManager{opts: opts}, nil
}

func (m *MPSManager) paths(uuid string) devicePaths {
	return pathsIn(filepath.Join(m.opts.Dir, dirName(uuid)))
}

// hostPaths are the device's files as the host (and so the container
// runtime) sees them.
func (m *MPSManager) hostPaths(uuid string) devicePaths {
	return pathsIn(filepath.Join(m.opts.HostDir, dirName(uuid)))
}

// Acquire prepares an MPS share of dev. The device's first share starts its
// control daemon, with the share config's defaults; a later share joins it
// (and gets a warning if its config asks for other defaults), and restarts it
// if it died. The result's Edits connect the share's containers to the daemon
// with the share's limits. Acquiring a share twice is the same as once.
func (m *MPSManager) Acquire(ctx context.Context, dev DeviceRef, share MPSShare) (*Result, error) {
	if err := dev.validate(); err != nil {
		return nil, fmt.Errorf("MPS share %q: %w", share.ID, err)
	}
	if share.ID == "" {
		return nil, fmt.Errorf("MPS share of %s: empty share ID", dev.UUID)
	}
	settings, err := daemonSettings(dev, share)
	if err != nil {
		return nil, fmt.Errorf("MPS share %q of %s: %w", share.ID, dev.UUID, err)
	}
	limit, err := clientPinnedLimitMiB(settings, share)
	if err != nil {
		return nil, fmt.Errorf("MPS share %q of %s: %w", share.ID, dev.UUID, err)
	}
	host := m.hostPaths(dev.UUID)
	edits, err := clientEdits(dev, share, host.pipe, m.opts.ContainerPipeDir)
	if err != nil {
		return nil, fmt.Errorf("MPS share %q of %s: %w", share.ID, dev.UUID, err)
	}
	for i := range edits.Mounts {
		// Clients only connect to the daemon's sockets, which works on a
		// read-only bind mount; they must not replace what the plugin and
		// the daemon trust there (the control socket, the pid file).
		edits.Mounts[i].ReadOnly = edits.Mounts[i].HostPath == host.pipe
	}
	if m.opts.ShmSize > 0 {
		edits.Mounts = append(edits.Mounts, cdi.Mount{HostPath: host.shm, ContainerPath: containerShmDir})
	}
	logger := klog.FromContext(ctx).WithValues("device", dev.UUID, "share", share.ID)
	ctx = klog.NewContext(ctx, logger)
	res := &Result{Strategy: gpuv1beta1.MPSStrategy, UUID: dev.UUID, PipeDir: host.pipe, Edits: edits}
	if limit != nil {
		res.MemoryLimitBytes = *limit << 20
	}

	unlock := m.locks.Lock(dev.UUID)
	defer unlock()
	p := m.paths(dev.UUID)
	var st mpsState
	found, err := readState(p.state, &st)
	if err != nil {
		return nil, err
	}
	if found && len(st.Shares) == 0 {
		// The last Release could not finish the teardown: finish it
		// first, so the new first share gets a daemon with its defaults
		// and the compute mode to restore is not overwritten.
		if err := m.teardown(ctx, &st); err != nil {
			return nil, fmt.Errorf("MPS share %q of %s: %w", share.ID, dev.UUID, err)
		}
		found = false
	}
	switch {
	case !found:
		st = mpsState{Version: stateVersion, UUID: dev.UUID, ParentUUID: dev.ParentUUID, Index: dev.Index, Settings: settings}
	case !st.Settings.equal(settings):
		if _, known := slices.BinarySearch(st.Shares, share.ID); !known {
			res.warnf(logger, "MPS control daemon of %s keeps the defaults of its first share (%s), not this share's (%s); the share's own limits still apply to its containers",
				dev.UUID, st.Settings, settings)
		}
	}
	shares, added := addShare(st.Shares, share.ID)
	st.Shares = shares

	pid, running, responsive := m.daemonStatus(p, st.PID)
	if responsive {
		if added {
			if err := writeState(p.state, &st); err != nil {
				return nil, err
			}
		}
		logger.V(4).Info("Joined MPS control daemon", "pid", pid, "shares", len(st.Shares))
		return res, nil
	}
	if running {
		logger.Info("MPS control daemon does not accept commands, stopping it", "pid", pid)
		if err := m.stopDaemon(ctx, p, pid); err != nil {
			return nil, err
		}
	}
	if len(st.Shares) > 1 {
		logger.Info("MPS control daemon of a shared device is not running, starting it again", "shares", len(st.Shares))
	}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create MPS directory: %w", err)
	}
	if err := writeState(p.state, &st); err != nil {
		return nil, err
	}
	if err := m.start(ctx, &st, res); err != nil {
		if added {
			st.Shares, _ = removeShare(st.Shares, share.ID)
		}
		if len(st.Shares) == 0 {
			// Clean up even when ctx was cancelled.
			cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*m.opts.StopTimeout+m.opts.CommandTimeout)
			defer cancel()
			if tdErr := m.teardown(cleanupCtx, &st); tdErr != nil {
				logger.Error(tdErr, "Clean up after failed MPS start")
			}
		} else if wErr := writeState(p.state, &st); wErr != nil {
			logger.Error(wErr, "Record shares after failed MPS start")
		}
		return nil, fmt.Errorf("MPS share %q of %s: %w", share.ID, dev.UUID, err)
	}
	return res, nil
}

// start sets a whole GPU's compute mode to EXCLUSIVE_PROCESS, starts the
// daemon and sends it the settings. Warnings go to res.
func (m *MPSManager) start(ctx context.Context, st *mpsState, res *Result) error {
	logger := klog.FromContext(ctx)
	dev := st.device()
	p := m.paths(st.UUID)
	if !dev.IsMIG() {
		if err := m.exclusiveProcess(ctx, st, res); err != nil {
			return err
		}
	}
	pid, err := m.startDaemon(ctx, dev, p)
	if err != nil {
		return err
	}
	st.PID = pid
	if err := writeState(p.state, st); err != nil {
		return err
	}
	for _, cmd := range st.Settings.commands(st.UUID) {
		out, err := m.control(ctx, p, cmd)
		if err != nil {
			return err
		}
		logger.V(4).Info("Sent MPS control command", "command", cmd, "output", out)
	}
	logger.Info("Started MPS control daemon", "pid", pid, "pipeDir", p.pipe, "settings", st.Settings.String())
	return nil
}

// exclusiveProcess sets the GPU's compute mode to EXCLUSIVE_PROCESS, as MPS
// needs, recording the mode to restore first.
func (m *MPSManager) exclusiveProcess(ctx context.Context, st *mpsState, res *Result) error {
	logger := klog.FromContext(ctx)
	if st.RestoreComputeMode == nil {
		mode, err := m.opts.ComputeModes.ComputeMode(ctx, st.UUID)
		switch {
		case errors.Is(err, ErrNotSupported):
			res.warnf(logger, "compute mode of GPU %s is left as it is: %v", st.UUID, err)
			return nil
		case err != nil:
			return err
		case mode == nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
			return nil
		}
		st.RestoreComputeMode = ptrTo(int(mode))
		if err := writeState(m.paths(st.UUID).state, st); err != nil {
			return err
		}
	}
	err := m.opts.ComputeModes.SetComputeMode(ctx, st.UUID, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
	if errors.Is(err, ErrNotSupported) {
		st.RestoreComputeMode = nil
		res.warnf(logger, "compute mode of GPU %s is not EXCLUSIVE_PROCESS, so processes outside MPS can use it too: %v", st.UUID, err)
		return writeState(m.paths(st.UUID).state, st)
	}
	return err
}

// Release unprepares an MPS share of dev. After the device's last share it
// stops the control daemon (quit, then signals) and restores the compute
// mode. Releasing an unknown share does nothing, so Release can be repeated.
// On an error the state is kept and the next Release or Acquire retries.
func (m *MPSManager) Release(ctx context.Context, dev DeviceRef, shareID string) error {
	if err := dev.validate(); err != nil {
		return fmt.Errorf("release MPS share %q: %w", shareID, err)
	}
	logger := klog.FromContext(ctx).WithValues("device", dev.UUID, "share", shareID)
	ctx = klog.NewContext(ctx, logger)
	unlock := m.locks.Lock(dev.UUID)
	defer unlock()
	var st mpsState
	if last, err := dropShare(m.paths(dev.UUID).state, &st, shareID); err != nil || !last {
		return err
	}
	if err := m.teardown(ctx, &st); err != nil {
		return fmt.Errorf("release MPS share %q: %w", shareID, err)
	}
	logger.Info("Stopped MPS control daemon after the device's last share")
	return nil
}

// teardown stops the device's daemon, restores the compute mode and removes
// the device's pipe directory and state; the logs stay. What fails stays
// recorded for the next try.
func (m *MPSManager) teardown(ctx context.Context, st *mpsState) error {
	p := m.paths(st.UUID)
	if err := m.stopDaemon(ctx, p, st.PID); err != nil {
		if wErr := writeState(p.state, st); wErr != nil {
			return errors.Join(err, wErr)
		}
		return err
	}
	if st.RestoreComputeMode != nil {
		err := m.opts.ComputeModes.SetComputeMode(ctx, st.UUID, nvml.ComputeMode(*st.RestoreComputeMode))
		if err != nil && !errors.Is(err, ErrNotSupported) {
			if wErr := writeState(p.state, st); wErr != nil {
				return errors.Join(err, wErr)
			}
			return fmt.Errorf("restore compute mode: %w", err)
		}
		st.RestoreComputeMode = nil
	}
	if err := removeShm(p); err != nil {
		return err
	}
	// The log directory stays, for operators; the next daemon appends.
	if err := os.RemoveAll(p.pipe); err != nil {
		return fmt.Errorf("remove MPS pipe directory of %s: %w", st.UUID, err)
	}
	if err := os.Remove(p.state); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove MPS state of %s: %w", st.UUID, err)
	}
	return nil
}

// Reconcile brings the daemons in line with the MPS shares the prepare path
// still holds after a restart (live must hold only MPS shares): a device's
// running daemon is adopted, a dead one is started again with the recorded
// settings, and the daemon of a device without shares is stopped. Call it
// once at start-up, before serving prepare calls.
func (m *MPSManager) Reconcile(ctx context.Context, live []ShareRef) error {
	logger := klog.FromContext(ctx)
	errs, err := reconcileDir(m.opts.Dir, live, func(e fs.DirEntry, ids map[string][]string) (string, error) {
		if !e.IsDir() {
			return "", nil
		}
		p := pathsIn(filepath.Join(m.opts.Dir, e.Name()))
		var peek mpsState
		found, err := readState(p.state, &peek)
		if err != nil {
			return "", err
		}
		if !found || e.Name() != dirName(peek.UUID) {
			return "", m.removeStateless(ctx, p, found)
		}
		return peek.UUID, m.reconcileDevice(ctx, peek.UUID, ids[peek.UUID])
	}, func(dev DeviceRef, shares []string) error {
		// The state is lost: start a daemon without defaults, so that the
		// shares' containers (which carry their own limits) work.
		for _, id := range shares {
			res, err := m.Acquire(ctx, dev, MPSShare{ID: id})
			if err != nil {
				return err
			}
			for _, w := range res.Warnings {
				logger.Info("MPS share adopted without state", "device", dev.UUID, "warning", w)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("MPS: %w", err)
	}
	if pruner, ok := m.opts.Launcher.(DaemonPruner); ok {
		if err := pruner.Prune(ctx, m.devicesInUse()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeStateless cleans up a directory without a device in use (no state,
// or the state of another device): only logs should be left. A daemon that
// runs without state is stopped, as it cannot be restored.
func (m *MPSManager) removeStateless(ctx context.Context, p devicePaths, hasState bool) error {
	var errs []error
	if _, err := os.Stat(p.pipe); err == nil {
		klog.FromContext(ctx).Info("Removing MPS pipe directory without state", "dir", p.pipe)
		if err := m.stopDaemon(ctx, p, 0); err != nil {
			return err
		}
		if err := os.RemoveAll(p.pipe); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeShm(p); err != nil {
		errs = append(errs, err)
	}
	if hasState {
		if err := os.Remove(p.state); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// FinishTeardowns retries the teardowns that could not finish: a device
// whose last share is gone but whose compute mode could not be restored
// (the GPU was lost when its last share was released, or when a restart
// found it without shares). Without a retry such a GPU stays in
// EXCLUSIVE_PROCESS after it is back until the next share or restart.
func (m *MPSManager) FinishTeardowns(ctx context.Context) error {
	entries, err := os.ReadDir(m.opts.Dir)
	if err != nil {
		return fmt.Errorf("MPS: list %s: %w", m.opts.Dir, err)
	}
	var errs []error
	for _, e := range entries {
		var peek mpsState
		found, err := readState(pathsIn(filepath.Join(m.opts.Dir, e.Name())).state, &peek)
		if err != nil || !found || len(peek.Shares) > 0 || e.Name() != dirName(peek.UUID) {
			continue
		}
		if err := m.finishTeardown(ctx, peek.UUID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *MPSManager) finishTeardown(ctx context.Context, uuid string) error {
	unlock := m.locks.Lock(uuid)
	defer unlock()
	p := m.paths(uuid)
	var st mpsState
	found, err := readState(p.state, &st)
	if err != nil || !found || len(st.Shares) > 0 {
		return err // a share came meanwhile: nothing to finish
	}
	if err := m.teardown(ctx, &st); err != nil {
		return fmt.Errorf("finish MPS teardown of %s: %w", uuid, err)
	}
	klog.FromContext(ctx).Info("Finished MPS teardown of a device without shares", "device", uuid)
	return nil
}

// devicesInUse are the names of the device directories that have state: the
// devices whose daemons should run.
func (m *MPSManager) devicesInUse() []string {
	var names []string
	entries, _ := os.ReadDir(m.opts.Dir)
	for _, e := range entries {
		if _, err := os.Stat(pathsIn(filepath.Join(m.opts.Dir, e.Name())).state); err == nil {
			names = append(names, e.Name())
		}
	}
	return names
}

func (m *MPSManager) reconcileDevice(ctx context.Context, uuid string, live []string) error {
	logger := klog.FromContext(ctx).WithValues("device", uuid)
	ctx = klog.NewContext(ctx, logger)
	unlock := m.locks.Lock(uuid)
	defer unlock()
	p := m.paths(uuid)
	var st mpsState
	found, err := readState(p.state, &st)
	if err != nil || !found {
		return err
	}
	if len(live) == 0 {
		st.Shares = nil
		if err := m.teardown(ctx, &st); err != nil {
			return fmt.Errorf("stop MPS control daemon of %s: %w", uuid, err)
		}
		logger.Info("Stopped MPS control daemon of a device without shares")
		return nil
	}
	st.Shares = live
	pid, running, responsive := m.daemonStatus(p, st.PID)
	if responsive {
		st.PID = pid
		logger.Info("Adopted running MPS control daemon", "pid", pid, "shares", len(live))
		return writeState(p.state, &st)
	}
	if running {
		logger.Info("MPS control daemon does not accept commands, stopping it", "pid", pid)
		if err := m.stopDaemon(ctx, p, pid); err != nil {
			return err
		}
	}
	logger.Info("MPS control daemon of a shared device is not running, starting it again", "shares", len(live))
	if err := writeState(p.state, &st); err != nil {
		return err
	}
	if err := m.start(ctx, &st, &Result{}); err != nil {
		return fmt.Errorf("restart MPS control daemon of %s: %w", uuid, err)
	}
	return nil
}
