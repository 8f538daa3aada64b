package kueue

import (
	"os"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

func TestMain(m *testing.M) { os.Exit(simnode.Main(m)) }

func published(t *testing.T, machine string) []resourceapi.ResourceSlice {
	t.Helper()
	var out []resourceapi.ResourceSlice
	for _, s := range simnode.New(t, machine, "node-1").Slices(vocabulary.DriverName) {
		out = append(out, *s)
	}
	return out
}

// The costs are nvidia-smi's slice counts of each profile (compute slices,
// memory slices of eight), read off what the device model publishes.
func TestProfileCostsFromPublishedCounters(t *testing.T) {
	for machine, want := range map[string]map[string]Cost{
		"dgxh100": {"1g.10gb": {1, 1}, "1g.20gb": {1, 2}, "2g.20gb": {2, 2}, "3g.40gb": {3, 4}, "4g.40gb": {4, 4}, "7g.80gb": {7, 8}},
		"dgxh200": {"1g.18gb": {1, 1}, "3g.71gb": {3, 4}, "7g.141gb": {7, 8}},
	} {
		t.Run(machine, func(t *testing.T) {
			costs, err := ProfileCosts(published(t, machine), vocabulary.DriverName)
			if err != nil {
				t.Fatal(err)
			}
			for p, c := range want {
				if costs[p] != c {
					t.Errorf("profile %s costs %+v, want %+v (all: %v)", p, costs[p], c, costs)
				}
			}
			if got := Largest(costs); got != (Cost{7, 8}) {
				t.Errorf("Largest = %+v, want a whole GPU {7 8}", got)
			}
		})
	}
}

func TestProfileCostsRefuses(t *testing.T) {
	h100 := published(t, "dgxh100")
	twisted := func() []resourceapi.ResourceSlice {
		// A second slice where 1g.10gb consumes two compute slices.
		s := *h100[0].DeepCopy()
		s.Name = "other"
		var dev resourceapi.Device
		for _, sl := range h100 {
			for _, d := range sl.Spec.Devices {
				if p := d.Attributes[vocabulary.AttrProfile].StringValue; p != nil && *p == "1g.10gb" {
					dev = *d.DeepCopy()
				}
			}
		}
		dev.ConsumesCounters[0].Counters[vocabulary.CounterComputeSlices] = resourceapi.Counter{Value: resource.MustParse("2")}
		s.Spec.Devices = []resourceapi.Device{dev}
		s.Spec.SharedCounters = nil
		return append(append([]resourceapi.ResourceSlice{}, h100...), s)
	}
	for name, tc := range map[string]struct {
		slices []resourceapi.ResourceSlice
		driver string
		want   string
	}{
		"no MIG":         {published(t, "l4x4"), vocabulary.DriverName, "no MIG devices"},
		"other driver":   {h100, "other.example.com", "no MIG devices"},
		"costs disagree": {twisted(), vocabulary.DriverName, "profile 1g.10gb"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ProfileCosts(tc.slices, tc.driver)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestTransformationsChargeTheDevicePluginNames(t *testing.T) {
	got := Transformations(map[string]Cost{"7g.80gb": {7, 8}, "1g.10gb+me": {1, 1}})
	if len(got) != 2 {
		t.Fatalf("got %d transformations, want 2: %+v", len(got), got)
	}
	for i, want := range []Transformation{
		{Input: "nvidia.com/mig-1g.10gb.me", Strategy: "Replace", Outputs: map[string]int64{ResourceComputeSlices: 1, ResourceMemorySlices: 1}},
		{Input: "nvidia.com/mig-7g.80gb", Strategy: "Replace", Outputs: map[string]int64{ResourceComputeSlices: 7, ResourceMemorySlices: 8}},
	} {
		g := got[i]
		if g.Input != want.Input || g.Strategy != want.Strategy || len(g.Outputs) != 2 ||
			g.Outputs[ResourceComputeSlices] != want.Outputs[ResourceComputeSlices] || g.Outputs[ResourceMemorySlices] != want.Outputs[ResourceMemorySlices] {
			t.Errorf("transformation %d = %+v, want %+v", i, g, want)
		}
	}
}

// The messages are Kueue v0.17.0's (pkg/scheduler/flavorassigner).
func TestWaitsForTellsHeldQuotaFromTooBig(t *testing.T) {
	for msg, want := range map[string]bool{
		"couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor gdd-default, 1 more needed":                                                                           true,
		"couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor gdd-default, previously considered podsets requests (0) + current podset request (5) > maximum capacity (4)": false,
		"couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu.shared in flavor gdd-default, 1 more needed":                                                                    false,
		"": false,
	} {
		if got := WaitsFor(msg, "nvidia.com/gpu"); got != want {
			t.Errorf("WaitsFor(%q) = %v, want %v", msg, got, want)
		}
	}
}
