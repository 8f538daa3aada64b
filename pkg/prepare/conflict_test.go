package prepare

import (
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

func TestPhysicalConflict(t *testing.T) {
	whole := func(gpu string) checkpoint.PreparedDevice {
		return checkpoint.PreparedDevice{Device: gpu, Kind: "gpu", GPUUUID: "GPU-" + gpu}
	}
	migAt := func(gpu string, start, size uint32) checkpoint.PreparedDevice {
		return checkpoint.PreparedDevice{
			Device: gpu + "-mig-" + string(rune('a'+start)), Kind: "mig", GPUUUID: "GPU-" + gpu,
			MIG: &checkpoint.MigInstance{ParentUUID: "GPU-" + gpu, Placement: checkpoint.MigPlacement{Start: start, Size: size}},
		}
	}
	share := func(gpu, kind, shareID string) checkpoint.PreparedDevice {
		return checkpoint.PreparedDevice{Device: gpu + "-" + kind, Kind: vocabulary.Kind(kind), GPUUUID: "GPU-" + gpu, ShareID: shareID}
	}
	admin := func(pd checkpoint.PreparedDevice) checkpoint.PreparedDevice {
		pd.AdminAccess = true
		return pd
	}
	// Older records lack GPUUUID: the MIG parent still names the GPU.
	oldMIG := migAt("g0", 4, 2)
	oldMIG.GPUUUID = ""
	tests := map[string]struct {
		a, b     checkpoint.PreparedDevice
		conflict bool
	}{
		"same whole GPU":                 {a: whole("g0"), b: whole("g0"), conflict: true},
		"other whole GPU":                {a: whole("g0"), b: whole("g1")},
		"whole GPU vs its MIG device":    {a: whole("g0"), b: migAt("g0", 0, 1), conflict: true},
		"MIG device vs its whole GPU":    {a: migAt("g0", 0, 1), b: whole("g0"), conflict: true},
		"whole GPU vs old MIG record":    {a: whole("g0"), b: oldMIG, conflict: true},
		"whole GPU vs its share":         {a: whole("g0"), b: share("g0", "timeslice", "s1"), conflict: true},
		"whole GPU vs other GPU's MIG":   {a: whole("g0"), b: migAt("g1", 0, 1)},
		"MIG placements overlap":         {a: migAt("g0", 0, 4), b: migAt("g0", 2, 2), conflict: true},
		"MIG placements overlap, inside": {a: migAt("g0", 2, 1), b: migAt("g0", 0, 4), conflict: true},
		"MIG placements adjacent":        {a: migAt("g0", 0, 2), b: migAt("g0", 2, 2)},
		"MIG vs share":                   {a: migAt("g0", 0, 1), b: share("g0", "mps", "s1"), conflict: true},
		"time-slicing vs MPS":            {a: share("g0", "timeslice", "s1"), b: share("g0", "mps", "s2"), conflict: true},
		"two time-slices":                {a: share("g0", "timeslice", "s1"), b: share("g0", "timeslice", "s2")},
		"two MPS shares":                 {a: share("g0", "mps", "s1"), b: share("g0", "mps", "s2")},
		"one share twice":                {a: share("g0", "mps", "s1"), b: share("g0", "mps", "s1"), conflict: true},
		"share without ID":               {a: share("g0", "mps", ""), b: share("g0", "mps", "s1"), conflict: true},
		"unknown kind holds its GPU":     {a: share("g0", "mps", "s1"), b: checkpoint.PreparedDevice{Device: "x", Kind: "vgpu", GPUUUID: "GPU-g0"}, conflict: true},
		"unknown kind on another GPU":    {a: whole("g0"), b: checkpoint.PreparedDevice{Device: "x", Kind: "vgpu", GPUUUID: "GPU-g1"}},
		"admin beside the whole GPU":     {a: admin(whole("g0")), b: whole("g0")},
		"whole GPU beside admin":         {a: whole("g0"), b: admin(whole("g0"))},
		"admin GPU beside its MIG":       {a: admin(whole("g0")), b: migAt("g0", 0, 1)},
		"MIG beside admin on it":         {a: migAt("g0", 0, 1), b: admin(migAt("g0", 0, 1))},
		"admin beside a share":           {a: admin(share("g0", "mps", "")), b: share("g0", "mps", "s1")},
		"admin beside an unknown kind":   {a: admin(whole("g0")), b: checkpoint.PreparedDevice{Device: "x", Kind: "vgpu", GPUUUID: "GPU-g0"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			why := physicalConflict(tc.a, tc.b)
			if (why != "") != tc.conflict {
				t.Errorf("physicalConflict = %q, want conflict %v", why, tc.conflict)
			}
		})
	}
}

// A whole GPU is refused while a MIG device of it is prepared, even if an
// allocation asks for both; the MIG device keeps working.
func TestPrepareRefusesWholeGPUUnderMIG(t *testing.T) {
	d := newTestDriver(t, nil)
	migDev := firstDynamicMIG(t, d, 0)
	if err := prepareOne(t, d, allocated("mig", []string{migDev})); err != nil {
		t.Fatalf("prepare MIG device %s: %v", migDev, err)
	}
	err := prepareOne(t, d, allocated("whole", []string{"gpu-0"}))
	if err == nil || !strings.Contains(err.Error(), "already prepared for claim ns/mig") {
		t.Fatalf("whole GPU under a prepared MIG device: err = %v, want a conflict naming the MIG claim", err)
	}
	if got := d.PreparedClaims(); len(got) != 1 || got[0].Name != "mig" {
		t.Errorf("prepared claims = %+v, want only the MIG claim", got)
	}
}

// One claim's own devices must not overlap either.
func TestPrepareRefusesOverlapWithinAClaim(t *testing.T) {
	d := newTestDriver(t, nil)
	err := prepareOne(t, d, allocated("both", []string{"gpu-0", firstDynamicMIG(t, d, 0)}))
	if err == nil || !strings.Contains(err.Error(), "of the same claim") {
		t.Fatalf("whole GPU and its MIG device in one claim: err = %v, want an overlap error", err)
	}
	if got := d.PreparedClaims(); len(got) != 0 {
		t.Errorf("prepared claims = %+v, want none", got)
	}
}
