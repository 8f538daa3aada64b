package sharing

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// newTimeSlicing returns a manager over the simulated machine.
func newTimeSlicing(t *testing.T, m *nvmlsim.Machine, stateDir string, slicer TimeSlicer) *TimeSlicingManager {
	t.Helper()
	if slicer == nil {
		slicer = NewSimSlicer(m)
	}
	mgr, err := NewTimeSlicingManager(TimeSlicingOptions{
		StateDir:     stateDir,
		TimeSlicer:   slicer,
		ComputeModes: NewNVMLComputeModes(m),
	})
	if err != nil {
		t.Fatal(err)
	}
	return mgr
}

func mustAcquireTS(t *testing.T, mgr *TimeSlicingManager, dev DeviceRef, share string, cfg *gpuv1beta1.TimeSlicingConfig) *Result {
	t.Helper()
	res, err := mgr.Acquire(testContext(t), dev, share, cfg)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", share, err)
	}
	return res
}

func mustReleaseTS(t *testing.T, mgr *TimeSlicingManager, dev DeviceRef, share string) {
	t.Helper()
	if err := mgr.Release(testContext(t), dev, share); err != nil {
		t.Fatalf("Release(%s): %v", share, err)
	}
}

// TestTimeSlicingFirstShareSetsLastRestores checks the GPU's settings after
// the first share, a second share, and the last release.
func TestTimeSlicingFirstShareSetsLastRestores(t *testing.T) {
	tests := map[string]struct {
		mode      nvml.ComputeMode
		level     int
		cfg       *gpuv1beta1.TimeSlicingConfig
		wantLevel int
		wantMode  nvml.ComputeMode
	}{
		"exclusive-process GPU, Long": {
			mode: nvml.COMPUTEMODE_EXCLUSIVE_PROCESS, cfg: interval(gpuv1beta1.LongTimeSlice),
			wantLevel: 3, wantMode: nvml.COMPUTEMODE_DEFAULT,
		},
		"default GPU at Short, Medium": {
			mode: nvml.COMPUTEMODE_DEFAULT, level: 1, cfg: interval(gpuv1beta1.MediumTimeSlice),
			wantLevel: 2, wantMode: nvml.COMPUTEMODE_DEFAULT,
		},
		"no config means Default": {
			mode: nvml.COMPUTEMODE_DEFAULT, level: 2, cfg: nil,
			wantLevel: 0, wantMode: nvml.COMPUTEMODE_DEFAULT,
		},
		"level already in force": {
			mode: nvml.COMPUTEMODE_DEFAULT, level: 3, cfg: interval(gpuv1beta1.LongTimeSlice),
			wantLevel: 3, wantMode: nvml.COMPUTEMODE_DEFAULT,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m := newSim(t, "dgxh100")
			stateDir := t.TempDir()
			mgr := newTimeSlicing(t, m, stateDir, nil)
			gpu := gpuRef(m, 2)
			setComputeModeOf(t, m, 2, tc.mode)
			if err := m.SetTimeslice(2, tc.level); err != nil {
				t.Fatal(err)
			}

			res := mustAcquireTS(t, mgr, gpu, "claim-a/req/gpu-2-ts", tc.cfg)
			if res.TimeSliceLevel == nil || *res.TimeSliceLevel != tc.wantLevel {
				t.Errorf("TimeSliceLevel = %v, want %d", res.TimeSliceLevel, tc.wantLevel)
			}
			if len(res.Warnings) > 0 {
				t.Errorf("unexpected warnings: %q", res.Warnings)
			}
			if got := m.Timeslice(2); got != tc.wantLevel {
				t.Errorf("level after first share = %d, want %d", got, tc.wantLevel)
			}
			if got := computeModeOf(t, m, 2); got != tc.wantMode {
				t.Errorf("compute mode after first share = %v, want %v", got, tc.wantMode)
			}
			if m.Timeslice(3) != 0 || computeModeOf(t, m, 3) != nvml.COMPUTEMODE_DEFAULT {
				t.Errorf("another GPU changed")
			}

			mustAcquireTS(t, mgr, gpu, "claim-b/req/gpu-2-ts", tc.cfg)
			mustReleaseTS(t, mgr, gpu, "claim-a/req/gpu-2-ts")
			if got := m.Timeslice(2); got != tc.wantLevel {
				t.Errorf("level with one share left = %d, want %d", got, tc.wantLevel)
			}

			mustReleaseTS(t, mgr, gpu, "claim-b/req/gpu-2-ts")
			if got := m.Timeslice(2); got != tc.level {
				t.Errorf("level after last share = %d, want the original %d", got, tc.level)
			}
			if got := computeModeOf(t, m, 2); got != tc.mode {
				t.Errorf("compute mode after last share = %v, want the original %v", got, tc.mode)
			}
			if names := dirEntries(t, stateDir); len(names) != 0 {
				t.Errorf("state left after last share: %v", names)
			}
		})
	}
}

// TestTimeSlicingFirstIntervalWins checks the rule for conflicting
// intervals: the first share's wins, a later one gets a warning.
func TestTimeSlicingFirstIntervalWins(t *testing.T) {
	m := newSim(t, "dgxh100")
	mgr := newTimeSlicing(t, m, t.TempDir(), nil)
	gpu := gpuRef(m, 0)

	mustAcquireTS(t, mgr, gpu, "a", interval(gpuv1beta1.ShortTimeSlice))
	res := mustAcquireTS(t, mgr, gpu, "b", interval(gpuv1beta1.LongTimeSlice))
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "first share") ||
		!strings.Contains(res.Warnings[0], "Long") || !strings.Contains(res.Warnings[0], "Short") {
		t.Errorf("warnings = %q, want one naming Long, Short and the first-share rule", res.Warnings)
	}
	if res.TimeSliceLevel == nil || *res.TimeSliceLevel != 1 {
		t.Errorf("TimeSliceLevel = %v, want 1 (Short)", res.TimeSliceLevel)
	}
	if got := m.Timeslice(0); got != 1 {
		t.Errorf("level = %d, want 1 (Short)", got)
	}
	// The rule holds after the first share is gone: the GPU keeps its
	// level until its last share.
	mustReleaseTS(t, mgr, gpu, "a")
	res = mustAcquireTS(t, mgr, gpu, "c", interval(gpuv1beta1.LongTimeSlice))
	if len(res.Warnings) != 1 || m.Timeslice(0) != 1 {
		t.Errorf("third share: warnings %q, level %d; want a warning and level 1", res.Warnings, m.Timeslice(0))
	}
	// Same interval: no warning.
	if res := mustAcquireTS(t, mgr, gpu, "d", interval(gpuv1beta1.ShortTimeSlice)); len(res.Warnings) != 0 {
		t.Errorf("same interval: warnings %q", res.Warnings)
	}
	for _, s := range []string{"b", "c", "d"} {
		mustReleaseTS(t, mgr, gpu, s)
	}
	if got := m.Timeslice(0); got != 0 {
		t.Errorf("level after last share = %d, want 0", got)
	}
}

// TestTimeSlicingMIGDevice checks that a MIG device's share changes nothing
// and that an interval for it is a warning, not an error.
func TestTimeSlicingMIGDevice(t *testing.T) {
	m := newSim(t, "dgxh100")
	stateDir := t.TempDir()
	mgr := newTimeSlicing(t, m, stateDir, nil)
	setComputeModeOf(t, m, 1, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
	mig := migRef(m, 1)

	res := mustAcquireTS(t, mgr, mig, "a", nil)
	if len(res.Warnings) != 0 || res.TimeSliceLevel != nil {
		t.Errorf("MIG share without config: warnings %q, level %v; want none", res.Warnings, res.TimeSliceLevel)
	}
	res = mustAcquireTS(t, mgr, mig, "b", interval(gpuv1beta1.LongTimeSlice))
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "MIG device") {
		t.Errorf("MIG share with Long: warnings %q, want one about the MIG device", res.Warnings)
	}
	if m.Timeslice(1) != 0 || computeModeOf(t, m, 1) != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("parent GPU changed: level %d, mode %v", m.Timeslice(1), computeModeOf(t, m, 1))
	}
	mustReleaseTS(t, mgr, mig, "a")
	mustReleaseTS(t, mgr, mig, "b")
	if names := dirEntries(t, stateDir); len(names) != 0 {
		t.Errorf("state for a MIG device: %v", names)
	}
}

// TestTimeSlicingNotSupported checks that settings the GPU or driver do not
// support are warnings, and that what was applied is still restored.
func TestTimeSlicingNotSupported(t *testing.T) {
	t.Run("driver without compute-policy", func(t *testing.T) {
		m := newSim(t, "dgxh100")
		root := t.TempDir()
		if err := m.WriteDriverRoot(root); err != nil {
			t.Fatal(err)
		}
		// The simulated nvidia-smi knows -L and the table only, like a
		// driver without compute-policy.
		slicer := &NvidiaSMITimeSlicer{Path: filepath.Join(root, "usr", "bin", "nvidia-smi")}
		mgr := newTimeSlicing(t, m, t.TempDir(), slicer)
		setComputeModeOf(t, m, 0, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
		gpu := gpuRef(m, 0)

		res := mustAcquireTS(t, mgr, gpu, "a", interval(gpuv1beta1.LongTimeSlice))
		if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "not applied") || res.TimeSliceLevel != nil {
			t.Errorf("warnings %q, level %v; want one warning and no level", res.Warnings, res.TimeSliceLevel)
		}
		if got := computeModeOf(t, m, 0); got != nvml.COMPUTEMODE_DEFAULT {
			t.Errorf("compute mode = %v, want DEFAULT", got)
		}
		mustReleaseTS(t, mgr, gpu, "a")
		if got := computeModeOf(t, m, 0); got != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
			t.Errorf("compute mode after release = %v, want EXCLUSIVE_PROCESS", got)
		}
	})
	t.Run("no compute mode", func(t *testing.T) {
		m := newSim(t, "l4x4")
		mgr := newTimeSlicing(t, m, t.TempDir(), nil)
		m.InjectError("GetComputeMode", 0, nvml.ERROR_NOT_SUPPORTED, -1)
		gpu := gpuRef(m, 0)

		res := mustAcquireTS(t, mgr, gpu, "a", interval(gpuv1beta1.MediumTimeSlice))
		if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "compute mode") {
			t.Errorf("warnings %q, want one about the compute mode", res.Warnings)
		}
		if got := m.Timeslice(0); got != 2 {
			t.Errorf("level = %d, want 2", got)
		}
		mustReleaseTS(t, mgr, gpu, "a")
		if got := m.Timeslice(0); got != 0 {
			t.Errorf("level after release = %d, want 0", got)
		}
	})
}

// failingSlicer fails SetTimeslice with err while fail is set.
type failingSlicer struct {
	TimeSlicer
	mu   sync.Mutex
	fail error
}

func (f *failingSlicer) SetTimeslice(ctx context.Context, gpu DeviceRef, level int) error {
	f.mu.Lock()
	err := f.fail
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.TimeSlicer.SetTimeslice(ctx, gpu, level)
}

func (f *failingSlicer) setFail(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

// TestTimeSlicingErrors checks that a failed set-up is rolled back and
// fails the preparation, and that a failed restore is retried.
func TestTimeSlicingErrors(t *testing.T) {
	m := newSim(t, "dgxh100")
	stateDir := t.TempDir()
	slicer := &failingSlicer{TimeSlicer: NewSimSlicer(m)}
	mgr := newTimeSlicing(t, m, stateDir, slicer)
	setComputeModeOf(t, m, 0, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
	gpu := gpuRef(m, 0)

	slicer.setFail(errors.New("nvidia-smi: insufficient permissions"))
	if _, err := mgr.Acquire(testContext(t), gpu, "a", interval(gpuv1beta1.LongTimeSlice)); err == nil || !strings.Contains(err.Error(), "insufficient permissions") {
		t.Fatalf("Acquire = %v, want the time slicer's error", err)
	}
	if got := computeModeOf(t, m, 0); got != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("compute mode after failed set-up = %v, want EXCLUSIVE_PROCESS restored", got)
	}
	if names := dirEntries(t, stateDir); len(names) != 0 {
		t.Errorf("state left after failed set-up: %v", names)
	}
	mustReleaseTS(t, mgr, gpu, "a") // unknown share: nothing to do

	slicer.setFail(nil)
	mustAcquireTS(t, mgr, gpu, "a", interval(gpuv1beta1.LongTimeSlice))
	m.InjectError("SetComputeMode", 0, nvml.ERROR_UNKNOWN, 1)
	if err := mgr.Release(testContext(t), gpu, "a"); err == nil {
		t.Fatal("Release succeeded although the compute mode could not be restored")
	}
	if got := m.Timeslice(0); got != 0 {
		t.Errorf("level after failed release = %d, want 0 (restored before the compute mode)", got)
	}
	mustReleaseTS(t, mgr, gpu, "a") // retried: the share is gone, the restore is not
	if got := computeModeOf(t, m, 0); got != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("compute mode after retried release = %v, want EXCLUSIVE_PROCESS", got)
	}
	if names := dirEntries(t, stateDir); len(names) != 0 {
		t.Errorf("state left after retried release: %v", names)
	}

	// A restore that failed is finished by the next first share before it
	// records its own values to restore.
	mustAcquireTS(t, mgr, gpu, "b", interval(gpuv1beta1.ShortTimeSlice))
	m.InjectError("SetComputeMode", 0, nvml.ERROR_UNKNOWN, 1)
	if err := mgr.Release(testContext(t), gpu, "b"); err == nil {
		t.Fatal("Release succeeded although the compute mode could not be restored")
	}
	mustAcquireTS(t, mgr, gpu, "c", interval(gpuv1beta1.MediumTimeSlice))
	mustReleaseTS(t, mgr, gpu, "c")
	if got := computeModeOf(t, m, 0); got != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("compute mode at the end = %v, want EXCLUSIVE_PROCESS", got)
	}
}

// TestTimeSlicingIdempotent checks that a repeated Acquire or Release, as a
// retried or rolled-back preparation makes, counts once.
func TestTimeSlicingIdempotent(t *testing.T) {
	m := newSim(t, "dgxh100")
	mgr := newTimeSlicing(t, m, t.TempDir(), nil)
	gpu := gpuRef(m, 4)
	mustAcquireTS(t, mgr, gpu, "a", interval(gpuv1beta1.LongTimeSlice))
	if res := mustAcquireTS(t, mgr, gpu, "a", interval(gpuv1beta1.LongTimeSlice)); len(res.Warnings) != 0 || *res.TimeSliceLevel != 3 {
		t.Errorf("repeated Acquire: %+v", res)
	}
	mustReleaseTS(t, mgr, gpu, "a")
	mustReleaseTS(t, mgr, gpu, "a")
	if got := m.Timeslice(4); got != 0 {
		t.Errorf("level = %d, want 0 after the only share", got)
	}
}

// TestTimeSlicingReconcile checks a restart: a new manager over the same
// state keeps the GPUs with live shares and restores the others.
func TestTimeSlicingReconcile(t *testing.T) {
	m := newSim(t, "dgxh100")
	stateDir := t.TempDir()
	before := newTimeSlicing(t, m, stateDir, nil)
	setComputeModeOf(t, m, 1, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
	gpu0, gpu1 := gpuRef(m, 0), gpuRef(m, 1)
	mustAcquireTS(t, before, gpu0, "a", interval(gpuv1beta1.LongTimeSlice))
	mustAcquireTS(t, before, gpu0, "b", interval(gpuv1beta1.LongTimeSlice))
	mustAcquireTS(t, before, gpu1, "c", interval(gpuv1beta1.ShortTimeSlice))

	after := newTimeSlicing(t, m, stateDir, nil)
	if err := after.Reconcile(testContext(t), []ShareRef{{Device: gpu0, ID: "a"}}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if m.Timeslice(0) != 3 {
		t.Errorf("GPU 0 with a live share: level %d, want 3", m.Timeslice(0))
	}
	if m.Timeslice(1) != 0 || computeModeOf(t, m, 1) != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("GPU 1 without live shares: level %d, mode %v; want restored", m.Timeslice(1), computeModeOf(t, m, 1))
	}
	// b was forgotten: releasing a restores GPU 0.
	mustReleaseTS(t, after, gpu0, "a")
	if m.Timeslice(0) != 0 {
		t.Errorf("GPU 0 after its last live share: level %d, want 0", m.Timeslice(0))
	}
	if names := dirEntries(t, stateDir); len(names) != 0 {
		t.Errorf("state left: %v", names)
	}
}

// TestTimeSlicingConcurrent acquires and releases shares of several GPUs
// from many goroutines (run with -race).
func TestTimeSlicingConcurrent(t *testing.T) {
	m := newSim(t, "dgxh100")
	stateDir := t.TempDir()
	mgr := newTimeSlicing(t, m, stateDir, nil)
	for i := range 4 {
		setComputeModeOf(t, m, i, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
	}
	ctx := testContext(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 4 {
		for s := range 6 {
			wg.Go(func() {
				gpu := gpuRef(m, g)
				id := fmt.Sprintf("share-%d-%d", g, s)
				if _, err := mgr.Acquire(ctx, gpu, id, interval(gpuv1beta1.LongTimeSlice)); err != nil {
					errs <- err
					return
				}
				if m.Timeslice(g) != 3 {
					errs <- fmt.Errorf("GPU %d at level %d while share %s is held", g, m.Timeslice(g), id)
				}
				if err := mgr.Release(ctx, gpu, id); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range 4 {
		if m.Timeslice(i) != 0 || computeModeOf(t, m, i) != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
			t.Errorf("GPU %d not restored: level %d, mode %v", i, m.Timeslice(i), computeModeOf(t, m, i))
		}
	}
	if names := dirEntries(t, stateDir); len(names) != 0 {
		t.Errorf("state left: %v", names)
	}
}
