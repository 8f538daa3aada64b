package reserve_test

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/reserve"
)

var gpus = []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}

// use is a GPUUse of gpus with the named GPUs partitioned and busy (a
// partitioned GPU is busy too).
func use(partitioned, busy []string) devicemodel.GPUUse {
	u := devicemodel.GPUUse{GPUs: gpus, Partitioned: map[string]bool{}, Busy: map[string]bool{}}
	for _, g := range partitioned {
		u.Partitioned[g], u.Busy[g] = true, true
	}
	for _, g := range busy {
		u.Busy[g] = true
	}
	return u
}

func newTracker(t *testing.T, k int, hold time.Duration, file string, now *time.Time) *reserve.Tracker {
	t.Helper()
	tr, err := reserve.New(t.Context(), reserve.Options{Policy: devicemodel.ReservePolicy{SpareGPUs: k}, Hold: hold,
		StateFile: file, Now: func() time.Time { return *now }})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestSparesAreSticky: the spares are the last free GPUs in publication
// order at first (whole-GPU claims, first-fit, take the lowest free GPU),
// then stay spares until used, whatever else becomes free; a used spare is
// replaced by the last free GPU.
func TestSparesAreSticky(t *testing.T) {
	type step struct {
		partitioned, busy []string
		spares, shown     []string
	}
	for name, steps := range map[string][]step{
		"last free GPUs": {
			{busy: []string{"gpu-3"}, spares: []string{"gpu-2"}, shown: []string{"gpu-2"}},
		},
		"whole GPUs taken in first-fit order leave the spare": {
			{spares: []string{"gpu-3"}, shown: []string{"gpu-3"}},
			{busy: []string{"gpu-0"}, spares: []string{"gpu-3"}, shown: []string{"gpu-3"}},
			{busy: []string{"gpu-0", "gpu-1"}, spares: []string{"gpu-3"}, shown: []string{"gpu-3"}},
			{busy: []string{"gpu-0", "gpu-1", "gpu-2"}, spares: []string{"gpu-3"}, shown: []string{"gpu-3"}},
		},
		"a GPU freed above the spare does not take its place": {
			{busy: []string{"gpu-3"}, spares: []string{"gpu-2"}, shown: []string{"gpu-2"}},
			{spares: []string{"gpu-2"}, shown: []string{"gpu-2"}},
		},
		"a used spare is replaced and stays shown while partitioned": {
			{spares: []string{"gpu-3"}, shown: []string{"gpu-3"}},
			{partitioned: []string{"gpu-3"}, spares: []string{"gpu-2"}, shown: []string{"gpu-2", "gpu-3"}},
			{partitioned: []string{"gpu-2", "gpu-3"}, busy: []string{"gpu-1"}, spares: []string{"gpu-0"}, shown: []string{"gpu-0", "gpu-2", "gpu-3"}},
		},
		"a spare held whole is replaced": {
			{spares: []string{"gpu-3"}, shown: []string{"gpu-3"}},
			{busy: []string{"gpu-3"}, spares: []string{"gpu-2"}, shown: []string{"gpu-2"}},
			{spares: []string{"gpu-2"}, shown: []string{"gpu-2"}},
		},
		"a freed partitioned GPU is hidden, the spare stays": {
			{partitioned: []string{"gpu-0"}, spares: []string{"gpu-3"}, shown: []string{"gpu-0", "gpu-3"}},
			{spares: []string{"gpu-3"}, shown: []string{"gpu-3"}},
		},
		"no free GPU, no spare": {
			{busy: gpus, spares: []string{}, shown: []string{}},
			{busy: []string{"gpu-1", "gpu-2", "gpu-3"}, spares: []string{"gpu-0"}, shown: []string{"gpu-0"}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			tr := newTracker(t, 1, -1, "", &now)
			for i, s := range steps {
				show, _ := tr.Show(t.Context(), use(s.partitioned, s.busy))
				if got := tr.Spares(); !slices.Equal(got, s.spares) && len(got)+len(s.spares) > 0 {
					t.Errorf("step %d: spares %v, want %v", i, got, s.spares)
				}
				if got := slices.Sorted(maps.Keys(show)); !slices.Equal(got, s.shown) && len(got)+len(s.shown) > 0 {
					t.Errorf("step %d: shown %v, want %v", i, got, s.shown)
				}
			}
		})
	}
}

// TestHold: a GPU that stops qualifying stays shown for the hold, and
// the tracker asks to be called again when it ends; after a start, every
// GPU is shown for the hold from the first Show (the first publication).
func TestHold(t *testing.T) {
	now := time.Unix(1000, 0)
	tr := newTracker(t, 1, 30*time.Second, "", &now)
	now = now.Add(time.Hour) // the first publication comes late: the start hold counts from it
	show, after := tr.Show(t.Context(), use([]string{"gpu-2"}, nil))
	if len(show) != len(gpus) || after != 30*time.Second {
		t.Fatalf("at start: shown %v, again after %s; want every GPU, 30s", show, after)
	}
	now = now.Add(31 * time.Second)
	show, after = tr.Show(t.Context(), use([]string{"gpu-2"}, nil))
	if want := []string{"gpu-2", "gpu-3"}; !slices.Equal(slices.Sorted(maps.Keys(show)), want) || after != 0 {
		t.Fatalf("after the start hold: shown %v, again after %s; want %v, 0", show, after, want)
	}
	now = now.Add(time.Second)
	show, after = tr.Show(t.Context(), use(nil, nil)) // gpu-2's claims went
	if !show["gpu-2"] || after != 30*time.Second {
		t.Fatalf("gpu-2 freed: shown %v, again after %s; want gpu-2 held 30s", show, after)
	}
	now = now.Add(10 * time.Second)
	if show, after = tr.Show(t.Context(), use(nil, nil)); !show["gpu-2"] || after != 20*time.Second {
		t.Fatalf("10s later: shown %v, again after %s; want gpu-2 held 20s more", show, after)
	}
	now = now.Add(20 * time.Second)
	if show, after = tr.Show(t.Context(), use(nil, nil)); show["gpu-2"] || after != 0 {
		t.Fatalf("hold over: shown %v, again after %s; want gpu-2 hidden", show, after)
	}
}

// TestSparesSurviveRestart: a restarted tracker keeps the spares it
// saved, though other GPUs became free meanwhile, and drops a saved spare
// that is now used; an unreadable state file is chosen anew.
func TestSparesSurviveRestart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "reserve.json")
	now := time.Unix(1000, 0)
	tr := newTracker(t, 2, -1, file, &now)
	tr.Show(t.Context(), use(nil, []string{"gpu-1", "gpu-3"}))
	if want := []string{"gpu-2", "gpu-0"}; !slices.Equal(tr.Spares(), want) {
		t.Fatalf("spares %v, want %v", tr.Spares(), want)
	}
	restarted := newTracker(t, 2, -1, file, &now)
	restarted.Show(t.Context(), use(nil, nil))
	if want := []string{"gpu-2", "gpu-0"}; !slices.Equal(restarted.Spares(), want) {
		t.Errorf("after a restart with gpu-1 and gpu-3 free: spares %v, want %v", restarted.Spares(), want)
	}
	again := newTracker(t, 2, -1, file, &now)
	again.Show(t.Context(), use([]string{"gpu-2"}, nil))
	if want := []string{"gpu-0", "gpu-3"}; !slices.Equal(again.Spares(), want) {
		t.Errorf("after a restart with gpu-2 partitioned: spares %v, want %v", again.Spares(), want)
	}
	if err := os.WriteFile(file, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	fresh := newTracker(t, 1, -1, file, &now)
	fresh.Show(t.Context(), use(nil, nil))
	if want := []string{"gpu-3"}; !slices.Equal(fresh.Spares(), want) {
		t.Errorf("unreadable state: spares %v, want %v", fresh.Spares(), want)
	}
}

// unsynced is an informer that has not listed the claims yet.
type unsynced struct{ synced bool }

func (u *unsynced) AllocatedDevices() map[string]bool   { return map[string]bool{} }
func (u *unsynced) AllocationsChanged() <-chan struct{} { return nil }
func (u *unsynced) Synced() bool                        { return u.synced }

// TestUnsyncedShowsEverything: until every allocation is known, every GPU
// is shown and the spares are not chosen; the start hold runs from the
// sync.
func TestUnsyncedShowsEverything(t *testing.T) {
	now := time.Unix(1000, 0)
	alloc := &unsynced{}
	tr, err := reserve.New(t.Context(), reserve.Options{Policy: devicemodel.ReservePolicy{SpareGPUs: 1}, Allocated: alloc,
		Hold: 30 * time.Second, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	if show, _ := tr.Show(t.Context(), use(nil, nil)); len(show) != len(gpus) || len(tr.Spares()) != 0 {
		t.Fatalf("unsynced: shown %v, spares %v; want every GPU, none", show, tr.Spares())
	}
	alloc.synced = true
	now = now.Add(29 * time.Second)
	if show, _ := tr.Show(t.Context(), use(nil, nil)); len(show) != len(gpus) {
		t.Fatalf("29s after the sync: shown %v, want every GPU", show)
	}
	now = now.Add(2 * time.Second)
	if show, _ := tr.Show(t.Context(), use(nil, nil)); len(show) != 1 || !show["gpu-3"] {
		t.Fatalf("31s after the sync: shown %v, want the spare gpu-3", show)
	}
}

func TestNewRefusesK0(t *testing.T) {
	if _, err := reserve.New(t.Context(), reserve.Options{}); err == nil {
		t.Error("New with spareGPUs 0 succeeded")
	}
}

// TestFreedGPUWaitsAHoldToBeASpare: on a full node, a freed GPU becomes
// the spare only once it has stayed free for the hold (a one-GPU pod
// usually takes it again first), and the tracker asks to be called when
// that is; GPUs free at the first choice are spares at once (TestHold).
func TestFreedGPUWaitsAHoldToBeASpare(t *testing.T) {
	now := time.Unix(1000, 0)
	tr := newTracker(t, 1, 30*time.Second, "", &now)
	tr.Show(t.Context(), use(nil, gpus))
	now = now.Add(time.Hour) // past the start hold
	step := func(what string, busy []string, wantSpares []string, wantAfter time.Duration) {
		t.Helper()
		show, after := tr.Show(t.Context(), use(nil, busy))
		if got := tr.Spares(); !slices.Equal(got, wantSpares) && len(got)+len(wantSpares) > 0 {
			t.Fatalf("%s: spares %v, want %v", what, got, wantSpares)
		}
		if len(show) != len(wantSpares) || after != wantAfter {
			t.Fatalf("%s: shown %v, again after %s; want the spares %v, %s", what, show, after, wantSpares, wantAfter)
		}
	}
	step("full", gpus, nil, 0)
	step("gpu-1 freed", []string{"gpu-0", "gpu-2", "gpu-3"}, nil, 30*time.Second)
	now = now.Add(10 * time.Second)
	step("10s later", []string{"gpu-0", "gpu-2", "gpu-3"}, nil, 20*time.Second)
	step("taken again", gpus, nil, 0)
	step("freed again", []string{"gpu-0", "gpu-2", "gpu-3"}, nil, 30*time.Second)
	now = now.Add(30 * time.Second)
	step("free for the hold", []string{"gpu-0", "gpu-2", "gpu-3"}, []string{"gpu-1"}, 0)
}
