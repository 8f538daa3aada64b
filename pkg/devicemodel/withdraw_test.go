package devicemodel_test

import (
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// TestWithdraw: what prepared devices of GPU 0 withdraw from a DGX H100's
// slices. Only GPU 0's slice changes, the slice count stays, and a
// prepared device is kept even when another prepared device conflicts
// with it.
func TestWithdraw(t *testing.T) {
	n := simnode.New(t, "dgxh100", "node-1")
	full := n.Resources
	gpu0 := names(full.Pools["node-1"].Slices[1].Devices)
	allBut := func(keep ...string) []string {
		return slices.DeleteFunc(slices.Clone(gpu0), func(s string) bool { return slices.Contains(keep, s) })
	}
	for name, tc := range map[string]struct {
		prepared  []string
		withdrawn []string
	}{
		"nothing prepared":         {},
		"prepared elsewhere":       {prepared: []string{"gpu-9-unknown"}},
		"whole GPU":                {prepared: []string{"gpu-0"}, withdrawn: allBut("gpu-0")},
		"time-slice share":         {prepared: []string{"gpu-0-ts"}, withdrawn: allBut("gpu-0-ts")},
		"MPS share":                {prepared: []string{"gpu-0-mps"}, withdrawn: allBut("gpu-0-mps")},
		"7g takes all memory":      {prepared: []string{"gpu-0-mig-7g80gb-0"}, withdrawn: allBut("gpu-0-mig-7g80gb-0")},
		"stale conflict kept both": {prepared: []string{"gpu-0", "gpu-0-ts"}, withdrawn: allBut("gpu-0", "gpu-0-ts")},
		"1g at the top": {
			prepared: []string{"gpu-0-mig-1g10gb-6"},
			// Everything covering memory slice 6, and what takes the whole GPU.
			withdrawn: []string{"gpu-0", "gpu-0-ts", "gpu-0-mps", "gpu-0-mig-1g10gb-me-6",
				"gpu-0-mig-1g20gb-6", "gpu-0-mig-3g40gb-4", "gpu-0-mig-7g80gb-0"},
		},
		"4g and 3g fill the GPU": {
			prepared:  []string{"gpu-0-mig-4g40gb-0", "gpu-0-mig-3g40gb-4"},
			withdrawn: allBut("gpu-0-mig-4g40gb-0", "gpu-0-mig-3g40gb-4"),
		},
	} {
		t.Run(name, func(t *testing.T) {
			prepared := map[string]bool{}
			for _, p := range tc.prepared {
				prepared[p] = true
			}
			got := devicemodel.Withdraw(full, "node-1", prepared)
			want, have := full.Pools["node-1"].Slices, got.Pools["node-1"].Slices
			if len(have) != len(want) {
				t.Fatalf("%d slices, want the full model's %d", len(have), len(want))
			}
			for i := range want {
				if !slices.Equal(names(have[i].Devices), names(want[i].Devices)) && i != 1 {
					t.Errorf("slice %d changed: %v", i, names(have[i].Devices))
				}
			}
			withdrawn := slices.DeleteFunc(slices.Clone(gpu0), func(s string) bool { return slices.Contains(names(have[1].Devices), s) })
			if !slices.Equal(withdrawn, sorted(tc.withdrawn, gpu0)) {
				t.Errorf("withdrawn %v\nwant      %v", withdrawn, sorted(tc.withdrawn, gpu0))
			}
			if len(full.Pools["node-1"].Slices[1].Devices) != len(gpu0) {
				t.Error("Withdraw changed its input")
			}
		})
	}
}

// TestSlicePerGPU: each GPU's devices are a slice of their own after the
// counter sets, in publication order.
func TestSlicePerGPU(t *testing.T) {
	n := simnode.New(t, "dgxh100", "node-1")
	s := n.Resources.Pools["node-1"].Slices
	if len(s) != 1+len(n.GPUs) || len(s[0].SharedCounters) != len(n.GPUs) {
		t.Fatalf("%d slices, want one of counter sets and one per GPU (%d)", len(s), len(n.GPUs))
	}
	for i, g := range n.GPUs {
		for _, d := range s[i+1].Devices {
			if !strings.HasPrefix(d.Name, g.CanonicalName()+"-") && d.Name != g.CanonicalName() {
				t.Errorf("slice %d (GPU %s) holds %s", i+1, g.CanonicalName(), d.Name)
			}
		}
	}
}

// sorted orders want as devices lists them.
func sorted(want, devices []string) []string {
	out := []string{}
	for _, d := range devices {
		if slices.Contains(want, d) {
			out = append(out, d)
		}
	}
	return out
}

func names(devices []resourceapi.Device) []string {
	out := []string{}
	for _, d := range devices {
		out = append(out, d.Name)
	}
	return out
}
