package devicemodel_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

var (
	leanSeed  = flag.Uint64("lean.seed", 0, "seed of TestLeanCountersEquivalence (0: from the clock)")
	leanSteps = flag.Int("lean.steps", 700, "steps of TestLeanCountersEquivalence per machine")
)

// TestLeanCountersEquivalence walks the random allocate, prepare, unprepare
// and release sequences of TestWithdrawEquivalence (multi-request claims,
// matchAttribute constraints, firstAvailable, shares with capacity, MIG
// devices of every profile) with the upstream allocator over two layouts of
// the same node: the lean counters the model publishes, and the layout
// before them, where whole GPUs and shares consume every counter of their
// GPU. At every allocate step both layouts must allocate the same devices or
// refuse alike, as published in full and as published after withdrawal.
// The walk fills the node and rarely fits the largest profiles, so a sweep
// per MIG profile from an empty node follows: that profile until it no
// longer fits, trying whole GPUs and shares beside it at each step.
func TestLeanCountersEquivalence(t *testing.T) {
	seed := *leanSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	steps := *leanSteps
	if testing.Short() {
		steps = 100
	}
	for _, machine := range []string{"dgxh100", "dgxa100", "dgxb200"} {
		t.Run(machine, func(t *testing.T) {
			rerun := fmt.Sprintf("seed %d (rerun: go test ./pkg/devicemodel -run 'TestLeanCountersEquivalence/%s' -lean.seed=%d -lean.steps=%d)", seed, machine, seed, steps)
			t.Log(rerun)
			n := simnode.New(t, machine, "node-1")
			old := everyCounterLayout(n.Resources)
			if lean, all := countersConsumed(n.Resources), countersConsumed(old); lean >= all {
				t.Fatalf("the lean layout consumes %d counters in all, the old one %d: nothing to compare", lean, all)
			}
			want := withdrawWalk(t, n, old, seed, steps)
			got := withdrawWalk(t, n, n.Resources, seed, steps)
			for i := range min(len(want.trace), len(got.trace)) {
				w, g := want.trace[i], got.trace[i]
				if w.step != g.step || w.claim != g.claim || !slices.Equal(w.full, g.full) || !slices.Equal(w.withdrawn, g.withdrawn) {
					t.Fatalf("%s\nstep %d: every-counter layout: %s gets %v in full, %v withdrawn; lean layout: %s gets %v in full, %v withdrawn",
						rerun, w.step, w.claim, w.full, w.withdrawn, g.claim, g.full, g.withdrawn)
				}
			}
			if len(want.trace) != len(got.trace) {
				t.Fatalf("%s\n%d allocate steps on the every-counter layout, %d on the lean one", rerun, len(want.trace), len(got.trace))
			}
			t.Logf("operations: %v; profiles the walk never allocated (the sweep below does): %v", got.ops, profilesNeverAllocated(n.Resources, got))
			for _, p := range n.GPUs[0].MIG.Profiles {
				want, got := profileSweep(t, n, old, p.Name), profileSweep(t, n, n.Resources, p.Name)
				for i := range want {
					if !slices.Equal(want[i], got[i]) {
						t.Errorf("profile %s, claim %d of the sweep: %v on the every-counter layout, %v on the lean one", p.Name, i, want[i], got[i])
						break
					}
				}
			}
		})
	}
}

// profileSweep allocates, on an empty node publishing res, devices of
// profile one claim at a time, one more than are published, each followed
// by claims for every whole GPU, every time-slice share and every MPS share
// of the node at once, and returns what each claim got (nil: refused).
func profileSweep(t *testing.T, n *simnode.Node, res resourceslice.DriverResources, profile string) [][]string {
	t.Helper()
	c := at.NewCluster(namedSlices(res, n.Name), deviceclass.DeviceClasses(driverName))
	placements := 0
	for _, d := range publishedByName(res).devices {
		if p := d.Attributes[vocabulary.AttrProfile].StringValue; p != nil && *p == profile {
			placements++
		}
	}
	all := int64(len(n.GPUs))
	var claims []*resourceapi.ResourceClaim
	for i := range placements + 1 {
		claims = append(claims,
			at.Claim(fmt.Sprintf("mig-%d", i), at.Exactly("mig", "mig."+driverName, 1, at.Profile(profile))),
			at.Claim(fmt.Sprintf("gpu-%d", i), at.Exactly("gpu", driverName, all)),
			at.Claim(fmt.Sprintf("ts-%d", i), at.Exactly("ts", "timeslice."+driverName, all)),
			at.Claim(fmt.Sprintf("mps-%d", i), at.Exactly("mps", "mps."+driverName, all)))
	}
	var out [][]string
	for _, claim := range claims {
		got, err := c.Allocate(context.Background(), n.Name, claim)
		if err != nil {
			t.Fatalf("profile %s: allocate %s: %v", profile, claim.Name, err)
		}
		var devices []string
		if got != nil {
			devices = at.Devices(got[0])
		}
		out = append(out, devices)
	}
	return out
}

// everyCounterLayout is res as published before lean counters: each whole
// GPU and share device consumes every counter of its GPU's counter set.
func everyCounterLayout(res resourceslice.DriverResources) resourceslice.DriverResources {
	out := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{}}
	for name, p := range res.Pools {
		sets := map[string]map[string]resourceapi.Counter{}
		for _, s := range p.Slices {
			for _, cs := range s.SharedCounters {
				sets[cs.Name] = cs.Counters
			}
		}
		var slices []resourceslice.Slice
		for _, s := range p.Slices {
			devices := make([]resourceapi.Device, len(s.Devices))
			for i := range s.Devices {
				d := s.Devices[i].DeepCopy()
				if kind := d.Attributes[vocabulary.AttrType].StringValue; kind != nil && *kind != string(vocabulary.KindMIG) {
					for j := range d.ConsumesCounters {
						d.ConsumesCounters[j].Counters = maps.Clone(sets[d.ConsumesCounters[j].CounterSet])
					}
				}
				devices[i] = *d
			}
			s.Devices = devices
			slices = append(slices, s)
		}
		p.Slices = slices
		out.Pools[name] = p
	}
	return out
}

// countersConsumed is how many counters the devices of res name in all.
func countersConsumed(res resourceslice.DriverResources) int {
	n := 0
	for _, p := range res.Pools {
		for _, s := range p.Slices {
			for _, d := range s.Devices {
				for _, c := range d.ConsumesCounters {
					n += len(c.Counters)
				}
			}
		}
	}
	return n
}

// profilesNeverAllocated are the MIG profiles published in res of which
// the walk allocated no device.
func profilesNeverAllocated(res resourceslice.DriverResources, w walk) []string {
	allocated := map[string]bool{}
	for _, s := range w.trace {
		for _, d := range slices.Concat(s.full, s.withdrawn) {
			allocated[d] = true
		}
	}
	seen := map[string]bool{}
	for name, d := range publishedByName(res).devices {
		if p := d.Attributes[vocabulary.AttrProfile].StringValue; p != nil {
			seen[*p] = seen[*p] || allocated[name]
		}
	}
	var missing []string
	for _, p := range slices.Sorted(maps.Keys(seen)) {
		if !seen[p] {
			missing = append(missing, p)
		}
	}
	return missing
}

// TestWholeConsumption: a whole GPU and its shares consume one counter at
// its full value, unless a MIG profile of the GPU would not be excluded by
// it.
func TestWholeConsumption(t *testing.T) {
	h100 := simnode.New(t, "dgxh100", "h").GPUs[0]
	l4 := simnode.New(t, "l4x4", "l").GPUs[0]
	odd := h100
	info := *h100.MIG
	info.Profiles = slices.Clone(info.Profiles)
	info.Profiles[0].ComputeSlices = 0
	odd.MIG = &info
	all := devicemodel.CounterSet(&odd).Counters
	for _, tc := range []struct {
		name string
		gpu  *discovery.GPU
		want map[string]int64
	}{
		{"MIG GPU: compute slices", &h100, map[string]int64{vocabulary.CounterComputeSlices: int64(h100.MIG.ComputeSlices)}},
		{"no MIG: its one memory slice", &l4, map[string]int64{vocabulary.MemorySliceCounter(0): 1}},
		{"a profile without compute slices: every counter", &odd, values(all)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, d := range []resourceapi.Device{
				devicemodel.WholeGPU(tc.gpu),
				devicemodel.ShareDevice(tc.gpu, vocabulary.KindTimeSlice, 4),
				devicemodel.ShareDevice(tc.gpu, vocabulary.KindMPS, 4),
			} {
				if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != devicemodel.CounterSetName(tc.gpu) {
					t.Fatalf("%s consumes %v, want one consumption of counter set %s", d.Name, d.ConsumesCounters, devicemodel.CounterSetName(tc.gpu))
				}
				if got := values(d.ConsumesCounters[0].Counters); !maps.Equal(got, tc.want) {
					t.Errorf("%s consumes %v, want %v", d.Name, got, tc.want)
				}
			}
		})
	}
}

func values(counters map[string]resourceapi.Counter) map[string]int64 {
	out := map[string]int64{}
	for name, c := range counters {
		out[name] = c.Value.Value()
	}
	return out
}
