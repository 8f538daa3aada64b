package sharing

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
	"github.com/gpu-dra/gpu-dra-driver/pkg/keyedmutex"
)

// TimeSlicingOptions configure a TimeSlicingManager.
type TimeSlicingOptions struct {
	// StateDir holds one small state file per time-sliced GPU (created if
	// missing), for example <plugin data dir>/sharing/timeslicing.
	StateDir string
	// TimeSlicer sets time-slice levels: an NvidiaSMITimeSlicer on a node,
	// simhooks.TimeSlicer (pkg/nvmlsim/simhooks) in simulation.
	TimeSlicer TimeSlicer
	// ComputeModes reads and sets compute modes, normally
	// NewNVMLComputeModes.
	ComputeModes ComputeModes
}

// TimeSlicingManager applies time-slicing to GPUs: on a GPU's first share it
// sets the compute mode to DEFAULT (when it is EXCLUSIVE_PROCESS) and the
// share's time-slice level, and after its last share it restores both. It is
// safe for concurrent use.
type TimeSlicingManager struct {
	opts  TimeSlicingOptions
	locks keyedmutex.Mutex
}

// tsState is a time-sliced GPU's state file.
type tsState struct {
	Version int    `json:"version"`
	UUID    string `json:"uuid"`
	Index   int    `json:"index"`
	// Shares are the IDs of the GPU's shares, sorted.
	Shares []string `json:"shares"`
	// Level is the time-slice level the first share asked for; later shares
	// get it too.
	Level int `json:"level"`
	// LevelApplied says that Level is in force on the GPU.
	LevelApplied bool `json:"levelApplied"`
	// RestoreLevel and RestoreComputeMode are what to set after the last
	// share; nil when the plugin did not change the setting. They are
	// recorded before the change.
	RestoreLevel       *int `json:"restoreLevel,omitempty"`
	RestoreComputeMode *int `json:"restoreComputeMode,omitempty"`
}

// NewTimeSlicingManager returns a manager that keeps its state in
// opts.StateDir.
func NewTimeSlicingManager(opts TimeSlicingOptions) (*TimeSlicingManager, error) {
	switch {
	case opts.StateDir == "":
		return nil, errors.New("time-slicing: state directory is empty")
	case opts.TimeSlicer == nil:
		return nil, errors.New("time-slicing: no TimeSlicer")
	case opts.ComputeModes == nil:
		return nil, errors.New("time-slicing: no ComputeModes")
	}
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("time-slicing: create state directory: %w", err)
	}
	if err := removeTemps(opts.StateDir); err != nil {
		return nil, fmt.Errorf("time-slicing: %w", err)
	}
	return &TimeSlicingManager{opts: opts}, nil
}

func (m *TimeSlicingManager) statePath(uuid string) string {
	return filepath.Join(m.opts.StateDir, dirName(uuid)+".json")
}

// Acquire prepares the time-sliced share shareID of gpu with cfg (nil means
// interval Default). The first share of a GPU sets its compute mode and
// time-slice level; a later share with another interval gets the first
// share's and a warning. A MIG device runs with its parent GPU's time-slice,
// so Acquire changes nothing for it. Settings the device does not support
// are warnings. Acquiring a share twice is the same as once.
func (m *TimeSlicingManager) Acquire(ctx context.Context, gpu DeviceRef, shareID string, cfg *gpuv1beta1.TimeSlicingConfig) (*Result, error) {
	if err := gpu.validate(); err != nil {
		return nil, fmt.Errorf("time-slice share %q: %w", shareID, err)
	}
	if shareID == "" {
		return nil, fmt.Errorf("time-slice share of %s: empty share ID", gpu.UUID)
	}
	level, err := intervalLevel(cfg)
	if err != nil {
		return nil, fmt.Errorf("time-slice share %q of %s: %w", shareID, gpu.UUID, err)
	}
	logger := klog.FromContext(ctx).WithValues("device", gpu.UUID, "share", shareID)
	res := &Result{Strategy: gpuv1beta1.TimeSlicingStrategy, UUID: gpu.UUID}
	if gpu.IsMIG() {
		if cfg != nil && cfg.Interval != nil && level != 0 {
			res.warnf(logger, "time-slice interval %s is not applied to MIG device %s: it runs with the interval of its GPU %s", *cfg.Interval, gpu.UUID, gpu.ParentUUID)
		}
		logger.V(4).Info("Time-sliced share of a MIG device needs no set-up")
		return res, nil
	}

	unlock := m.locks.Lock(gpu.UUID)
	defer unlock()
	path := m.statePath(gpu.UUID)
	var st tsState
	found, err := readState(path, &st)
	if err != nil {
		return nil, err
	}
	if found && len(st.Shares) == 0 {
		// The last Release could not restore the GPU: finish that first,
		// so the values to restore are not overwritten by ours.
		if err := m.restore(ctx, &st); err != nil {
			return nil, fmt.Errorf("time-slice share %q: %w", shareID, err)
		}
		found = false
	}
	if found {
		shares, added := addShare(st.Shares, shareID)
		if level != st.Level {
			res.warnf(logger, "time-slice interval %s is not applied to GPU %s: it runs with interval %s, which its first share set (the first share's interval wins)",
				intervalName(level), gpu.UUID, intervalName(st.Level))
		}
		if added {
			st.Shares = shares
			if err := writeState(path, &st); err != nil {
				return nil, err
			}
		}
		if st.LevelApplied {
			res.TimeSliceLevel = ptrTo(st.Level)
		}
		logger.V(4).Info("Joined time-sliced GPU", "shares", len(st.Shares))
		return res, nil
	}

	st = tsState{Version: stateVersion, UUID: gpu.UUID, Index: gpu.Index, Shares: []string{shareID}, Level: level}
	if err := m.apply(ctx, logger, gpu, &st, res); err != nil {
		st.Shares = nil
		// Restore even when ctx was cancelled.
		if rbErr := m.restore(context.WithoutCancel(ctx), &st); rbErr != nil {
			logger.Error(rbErr, "Restore GPU after failed time-slicing set-up")
		}
		return nil, fmt.Errorf("time-slice share %q: %w", shareID, err)
	}
	if st.LevelApplied {
		res.TimeSliceLevel = ptrTo(st.Level)
	}
	logger.Info("Time-slicing GPU", "level", intervalName(level), "levelApplied", st.LevelApplied)
	return res, nil
}

// apply sets up the GPU for its first share, recording what to restore in
// the state file before each change.
func (m *TimeSlicingManager) apply(ctx context.Context, logger klog.Logger, gpu DeviceRef, st *tsState, res *Result) error {
	path := m.statePath(gpu.UUID)
	if err := writeState(path, st); err != nil {
		return err
	}
	mode, err := m.opts.ComputeModes.ComputeMode(ctx, gpu.UUID)
	switch {
	case errors.Is(err, ErrNotSupported):
		res.warnf(logger, "compute mode of GPU %s is left as it is: %v", gpu.UUID, err)
	case err != nil:
		return err
	case mode == nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		st.RestoreComputeMode = ptrTo(int(mode))
		if err := writeState(path, st); err != nil {
			return err
		}
		err := m.opts.ComputeModes.SetComputeMode(ctx, gpu.UUID, nvml.COMPUTEMODE_DEFAULT)
		if errors.Is(err, ErrNotSupported) {
			st.RestoreComputeMode = nil
			res.warnf(logger, "compute mode of GPU %s stays EXCLUSIVE_PROCESS, so only one process at a time can use it: %v", gpu.UUID, err)
		} else if err != nil {
			return err
		}
	case mode == nvml.COMPUTEMODE_PROHIBITED:
		res.warnf(logger, "GPU %s is in compute mode PROHIBITED, which an administrator set: no process can use it", gpu.UUID)
	}

	current, err := m.opts.TimeSlicer.Timeslice(ctx, gpu)
	if err != nil {
		current = -1 // unknown: set the level, restore Default afterwards
	}
	if current == st.Level {
		st.LevelApplied = true
		return writeState(path, st)
	}
	st.RestoreLevel = ptrTo(max(current, 0))
	if err := writeState(path, st); err != nil {
		return err
	}
	err = m.opts.TimeSlicer.SetTimeslice(ctx, gpu, st.Level)
	switch {
	case errors.Is(err, ErrNotSupported):
		st.RestoreLevel = nil
		res.warnf(logger, "time-slice interval %s is not applied to GPU %s: %v", intervalName(st.Level), gpu.UUID, err)
	case err != nil:
		st.RestoreLevel = nil // a failed set is taken as not applied
		return err
	default:
		st.LevelApplied = true
	}
	return writeState(path, st)
}

// Release unprepares the share shareID of gpu. After the GPU's last share
// it restores the compute mode and time-slice level the plugin changed.
// Releasing an unknown share does nothing, so Release can be repeated. On an
// error the state is kept and the next Release or Acquire retries.
func (m *TimeSlicingManager) Release(ctx context.Context, gpu DeviceRef, shareID string) error {
	if err := gpu.validate(); err != nil {
		return fmt.Errorf("release time-slice share %q: %w", shareID, err)
	}
	if gpu.IsMIG() {
		return nil
	}
	unlock := m.locks.Lock(gpu.UUID)
	defer unlock()
	var st tsState
	if last, err := dropShare(m.statePath(gpu.UUID), &st, shareID); err != nil || !last {
		return err
	}
	if err := m.restore(ctx, &st); err != nil {
		return fmt.Errorf("release time-slice share %q: %w", shareID, err)
	}
	klog.FromContext(ctx).Info("Restored GPU after its last time-sliced share", "device", gpu.UUID)
	return nil
}

// restore sets back what the plugin changed on the GPU and removes the
// state file. What it cannot restore stays recorded for the next try.
func (m *TimeSlicingManager) restore(ctx context.Context, st *tsState) error {
	logger := klog.FromContext(ctx).WithValues("device", st.UUID)
	gpu := DeviceRef{UUID: st.UUID, Index: st.Index}
	var errs []error
	if st.RestoreLevel != nil {
		err := m.opts.TimeSlicer.SetTimeslice(ctx, gpu, *st.RestoreLevel)
		switch {
		case errors.Is(err, ErrNotSupported):
			logger.Info("Time-slice level not restored", "err", err)
			st.RestoreLevel = nil
		case err != nil:
			errs = append(errs, err)
		default:
			st.RestoreLevel = nil
		}
	}
	if st.RestoreComputeMode != nil {
		err := m.opts.ComputeModes.SetComputeMode(ctx, st.UUID, nvml.ComputeMode(*st.RestoreComputeMode))
		switch {
		case errors.Is(err, ErrNotSupported):
			logger.Info("Compute mode not restored", "err", err)
			st.RestoreComputeMode = nil
		case err != nil:
			errs = append(errs, err)
		default:
			st.RestoreComputeMode = nil
		}
	}
	path := m.statePath(st.UUID)
	if len(errs) > 0 {
		if err := writeState(path, st); err != nil {
			errs = append(errs, err)
		}
		return fmt.Errorf("restore GPU %s: %w", st.UUID, errors.Join(errs...))
	}
	if err := atomicfile.Remove(path); err != nil {
		return fmt.Errorf("remove sharing state of %s: %w", st.UUID, err)
	}
	return nil
}

// Reconcile brings the state in line with the shares the prepare path still
// holds after a restart: shares not in live are forgotten, and GPUs left
// without shares are restored. Call it once at start-up, before serving
// prepare calls.
func (m *TimeSlicingManager) Reconcile(ctx context.Context, live []ShareRef) error {
	errs, err := reconcileDir(m.opts.StateDir, live, func(e fs.DirEntry, ids map[string][]string) (string, error) {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") || atomicfile.IsTemp(e.Name()) {
			return "", nil
		}
		var peek tsState
		if _, err := readState(filepath.Join(m.opts.StateDir, e.Name()), &peek); err != nil {
			return "", err
		}
		return peek.UUID, m.reconcileGPU(ctx, peek.UUID, ids[peek.UUID])
	}, func(dev DeviceRef, _ []string) error {
		if !strings.HasPrefix(dev.UUID, "MIG-") {
			klog.FromContext(ctx).Info("Time-sliced GPU has no sharing state; its settings are left as they are", "device", dev.UUID)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("time-slicing: %w", err)
	}
	return errors.Join(errs...)
}

func (m *TimeSlicingManager) reconcileGPU(ctx context.Context, uuid string, live []string) error {
	unlock := m.locks.Lock(uuid)
	defer unlock()
	var st tsState
	found, err := readState(m.statePath(uuid), &st)
	if err != nil || !found {
		return err
	}
	keep := intersect(st.Shares, live)
	if len(keep) == 0 {
		st.Shares = nil
		if err := m.restore(ctx, &st); err != nil {
			return err
		}
		klog.FromContext(ctx).Info("Restored GPU without time-sliced shares", "device", uuid)
		return nil
	}
	if len(keep) != len(st.Shares) {
		st.Shares = keep
		return writeState(m.statePath(uuid), &st)
	}
	return nil
}

// intervalLevel returns the compute-policy level of cfg's interval; nil
// means Default.
func intervalLevel(cfg *gpuv1beta1.TimeSlicingConfig) (int, error) {
	if cfg == nil || cfg.Interval == nil {
		return 0, nil
	}
	return cfg.Interval.ComputePolicyValue()
}

// intervalName names a compute-policy level.
func intervalName(level int) string {
	for _, i := range []gpuv1beta1.TimeSliceInterval{gpuv1beta1.DefaultTimeSlice, gpuv1beta1.ShortTimeSlice, gpuv1beta1.MediumTimeSlice, gpuv1beta1.LongTimeSlice} {
		if v, err := i.ComputePolicyValue(); err == nil && v == level {
			return string(i)
		}
	}
	return fmt.Sprintf("level %d", level)
}
