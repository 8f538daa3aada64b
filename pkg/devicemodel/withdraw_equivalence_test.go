package devicemodel_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

var (
	withdrawSeed  = flag.Uint64("withdraw.seed", 0, "seed of TestWithdrawEquivalence (0: from the clock)")
	withdrawSteps = flag.Int("withdraw.steps", 400, "steps of TestWithdrawEquivalence")
)

// held is a claim the scheduler allocated, as the node sees it.
type held struct {
	claim    *resourceapi.ResourceClaim
	prepared bool
	// released: deallocated while still prepared (a force-deleted pod
	// whose unprepare is still to come).
	released bool
}

// TestWithdrawEquivalence runs random sequences of allocate, prepare,
// unprepare and release on a DGX H100 with the upstream allocator, once
// over the full model and once over what the node publishes after
// withdrawing (devicemodel.Withdraw of what is prepared), and checks at each
// step: the withdrawn model never allocates devices that conflict (with
// each other, with allocated claims, or with claims still prepared after
// their release), and while no released claim is still prepared it
// allocates exactly what the full model allocates, so every allocation the
// full model allows is still allowed once the node has republished.
func TestWithdrawEquivalence(t *testing.T) {
	seed := *withdrawSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun: go test ./pkg/devicemodel -run TestWithdrawEquivalence -withdraw.seed=%d)", seed, seed)
	n := simnode.New(t, "dgxh100", "node-1")
	w := withdrawWalk(t, n, n.Resources, seed, *withdrawSteps)
	t.Logf("operations: %v", w.ops)
	if w.ops["allocate"] == 0 || w.ops["prepare"] == 0 || w.ops["allocate (does not fit)"] == 0 {
		t.Errorf("the sequence did not exercise allocations, prepares and a full node: %v", w.ops)
	}
}

// walk is what a random sequence did: per allocate step, what the full
// and the withdrawn model allocated, and how often each operation ran.
type walk struct {
	trace []allocateStep
	ops   map[string]int
}

// allocateStep is one allocate of a walk; full and withdrawn are nil when
// the claim did not fit.
type allocateStep struct {
	step            int
	claim           string
	full, withdrawn []string
}

// withdrawWalk runs steps random operations from seed over res (the full
// model of node n), checking withdrawal at each step as
// TestWithdrawEquivalence describes. The sequence depends only on seed and
// on which claims allocate, so two layouts that allocate alike walk alike.
func withdrawWalk(t *testing.T, n *simnode.Node, res resourceslice.DriverResources, seed uint64, steps int) walk {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0))
	ctx := context.Background()
	classes := deviceclass.DeviceClasses(driverName)
	full := at.NewCluster(namedSlices(res, n.Name), classes)
	withdrawn := at.NewCluster(namedSlices(res, n.Name), classes)
	devices := publishedByName(res)
	var profiles []string
	for _, p := range n.GPUs[0].MIG.Profiles {
		profiles = append(profiles, p.Name)
	}

	var claims []*held
	republish := func() {
		prepared := map[string]bool{}
		for _, h := range claims {
			if h.prepared {
				for _, r := range h.claim.Status.Allocation.Devices.Results {
					prepared[r.Device] = true
				}
			}
		}
		withdrawn.Slices = namedSlices(devicemodel.Withdraw(res, n.Name, prepared), n.Name)
	}
	allocated := func() []*resourceapi.ResourceClaim {
		var out []*resourceapi.ResourceClaim
		for _, h := range claims {
			if !h.released {
				out = append(out, h.claim)
			}
		}
		return out
	}
	stale := func() bool { return slices.ContainsFunc(claims, func(h *held) bool { return h.released }) }
	w := walk{ops: map[string]int{}}
	ops := w.ops
	for step := range steps {
		switch op := rng.IntN(20); {
		case op < 10:
			claim := randomClaim(rng, profiles, step)
			base := allocated()
			full.Allocated, withdrawn.Allocated = slices.Clone(base), slices.Clone(base)
			fullGot, err := full.Allocate(ctx, n.Name, claim.DeepCopy())
			if err != nil {
				t.Fatalf("step %d: full model: allocate %s: %v", step, describe(claim), err)
			}
			got, err := withdrawn.Allocate(ctx, n.Name, claim.DeepCopy())
			if err != nil {
				t.Fatalf("step %d: withdrawn model: allocate %s: %v", step, describe(claim), err)
			}
			if got != nil {
				var released []*resourceapi.ResourceClaim
				for _, h := range claims {
					if h.released {
						released = append(released, h.claim)
					}
				}
				if err := conflict(devices, append(allocated(), got[0]), released); err != nil {
					t.Fatalf("step %d: withdrawn model allocated %s to %s: %v", step, at.Devices(got[0]), describe(claim), err)
				}
			}
			if !stale() {
				switch {
				case fullGot != nil && got == nil:
					t.Fatalf("step %d: %s allocates %v on the full model but not once the node has withdrawn devices", step, describe(claim), at.Devices(fullGot[0]))
				case fullGot == nil && got != nil:
					t.Fatalf("step %d: %s allocates %v only on the withdrawn model", step, describe(claim), at.Devices(got[0]))
				case got != nil && !slices.Equal(at.Devices(got[0]), at.Devices(fullGot[0])):
					t.Fatalf("step %d: %s gets %v on the withdrawn model, %v on the full one", step, describe(claim), at.Devices(got[0]), at.Devices(fullGot[0]))
				}
			}
			record := allocateStep{step: step, claim: describe(claim)}
			if fullGot != nil {
				record.full = at.Devices(fullGot[0])
			}
			if got != nil {
				record.withdrawn = at.Devices(got[0])
			}
			w.trace = append(w.trace, record)
			if got != nil {
				claims = append(claims, &held{claim: got[0]})
				ops["allocate"]++
			} else {
				ops["allocate (does not fit)"]++
			}
		default:
			lifecycleStep(rng, op, claims, ops)
		}
		claims = slices.DeleteFunc(claims, func(h *held) bool { return h.released && !h.prepared })
		republish()
	}
	return w
}

// lifecycleStep is a walk's step op (10..19 of 20) other than an
// allocate, on a random claim: prepare (10..13), unprepare (14..16) or
// release (17..19; a quarter of the prepared ones are released before
// their unprepare, as a force-deleted pod's); ops counts it.
func lifecycleStep(rng *rand.Rand, op int, claims []*held, ops map[string]int) {
	pick := func(ok func(*held) bool) *held {
		c := slices.DeleteFunc(slices.Clone(claims), func(h *held) bool { return !ok(h) })
		if len(c) == 0 {
			return nil
		}
		return c[rng.IntN(len(c))]
	}
	switch {
	case op < 14:
		if h := pick(func(h *held) bool { return !h.prepared && !h.released }); h != nil {
			h.prepared = true
			ops["prepare"]++
		}
	case op < 17:
		if h := pick(func(h *held) bool { return h.prepared }); h != nil {
			h.prepared = false
			ops["unprepare"]++
		}
	default:
		h := pick(func(h *held) bool { return !h.released })
		switch {
		case h == nil:
		case h.prepared && rng.IntN(4) == 0:
			h.released = true
			ops["release while prepared"]++
		default:
			h.prepared, h.released = false, true // the kubelet unprepares, then the claim is deallocated
			ops["release"]++
		}
	}
}

// randomClaim is one claim of the kinds a pod asks for: whole GPUs, MIG
// devices of any profile, shares with capacity, several requests under a
// matchAttribute constraint, and firstAvailable alternatives.
func randomClaim(rng *rand.Rand, profiles []string, step int) *resourceapi.ResourceClaim {
	name := fmt.Sprintf("claim-%d", step)
	mig := func(req string) resourceapi.DeviceRequest {
		return at.Exactly(req, "mig."+driverName, 1+int64(rng.IntN(2)), at.Profile(profiles[rng.IntN(len(profiles))]))
	}
	var claim *resourceapi.ResourceClaim
	switch rng.IntN(7) {
	case 0:
		claim = at.Claim(name, at.Exactly("gpu", driverName, 1+int64(rng.IntN(2))))
	case 1:
		claim = at.Claim(name, mig("mig"))
	case 2:
		claim = at.Claim(name, at.WithCapacity(at.Exactly("ts", "timeslice."+driverName, 1), map[string]string{
			vocabulary.CapacityCompute: fmt.Sprint(10 + rng.IntN(50)), vocabulary.CapacityMemory: fmt.Sprintf("%dGi", 1+rng.IntN(40)),
		}))
	case 3:
		claim = at.Claim(name, at.Exactly("mps", "mps."+driverName, 1))
	case 4:
		claim = at.WithConstraints(at.Claim(name, mig("a"), mig("b")), at.MatchAttribute(attr(vocabulary.AttrParentUUID)))
	case 5:
		claim = at.Claim(name, at.FirstAvailable("any",
			at.Sub("gpus", driverName, 2),
			at.Sub("mig", "mig."+driverName, 1, at.Profile(profiles[rng.IntN(len(profiles))])),
			at.Sub("share", "timeslice."+driverName, 1)))
	default:
		claim = at.WithConstraints(at.Claim(name, at.Exactly("gpu", driverName, 1), at.Exactly("mps", "mps."+driverName, 1)),
			at.MatchAttribute(attr(vocabulary.AttrNUMANode)))
	}
	claim.UID = types.UID(name)
	return claim
}

// describe names a claim's requests for failure messages.
func describe(claim *resourceapi.ResourceClaim) string {
	var reqs []string
	for _, r := range claim.Spec.Devices.Requests {
		if r.Exactly != nil {
			reqs = append(reqs, fmt.Sprintf("%s:%s×%d%v", r.Name, r.Exactly.DeviceClassName, r.Exactly.Count, r.Exactly.Selectors))
		} else {
			reqs = append(reqs, fmt.Sprintf("%s:firstAvailable(%d)", r.Name, len(r.FirstAvailable)))
		}
	}
	return fmt.Sprintf("%s%v", claim.Name, reqs)
}

// conflict checks that the claims' devices can be used together on the
// full model: an exclusive device once, counters and share capacity not
// overdrawn. The devices of released claims still prepared count for the
// counters, so nothing that conflicts with them is allocated; but a
// prepared device stays published, so the scheduler may hand out that very
// device (or the share capacity a released share freed) again, on either
// model: the node cannot tell a released claim (docs/device-model.md).
func conflict(m fullModel, claims, released []*resourceapi.ResourceClaim) error {
	left := map[string]map[string]resource.Quantity{}
	for set := range m.counters {
		left[set] = map[string]resource.Quantity{}
	}
	exclusive := map[string]bool{}
	used := map[string]bool{}
	capacity := map[string]map[resourceapi.QualifiedName]resource.Quantity{}
	for c, claim := range append(slices.Clone(claims), released...) {
		for _, r := range claim.Status.Allocation.Devices.Results {
			d := m.devices[r.Device]
			if r.ShareID == nil && c < len(claims) {
				if exclusive[r.Device] {
					return fmt.Errorf("exclusive device %s allocated twice", r.Device)
				}
				exclusive[r.Device] = true
			}
			if used[r.Device] {
				if exclusive[r.Device] && c < len(claims) {
					return fmt.Errorf("device %s allocated whole and shared", r.Device)
				}
			} else {
				used[r.Device] = true
				for _, c := range d.ConsumesCounters {
					for name, q := range c.Counters {
						v := left[c.CounterSet][name]
						v.Add(q.Value)
						left[c.CounterSet][name] = v
					}
				}
			}
			for name, q := range r.ConsumedCapacity {
				if c >= len(claims) {
					break
				}
				if capacity[r.Device] == nil {
					capacity[r.Device] = map[resourceapi.QualifiedName]resource.Quantity{}
				}
				v := capacity[r.Device][name]
				v.Add(q)
				capacity[r.Device][name] = v
				if total := d.Capacity[name].Value; v.Cmp(total) > 0 {
					return fmt.Errorf("share device %s: %s %s of %s", r.Device, name, v.String(), total.String())
				}
			}
		}
	}
	for set, consumed := range left {
		for name, v := range consumed {
			if total := m.counters[set][name].Value; v.Cmp(total) > 0 {
				return fmt.Errorf("counter %s/%s: %s consumed of %s", set, name, v.String(), total.String())
			}
		}
	}
	return nil
}

// fullModel is the full model's devices by name and its counters.
type fullModel struct {
	devices  map[string]resourceapi.Device
	counters map[string]map[string]resourceapi.Counter
}

func publishedByName(res resourceslice.DriverResources) fullModel {
	m := fullModel{devices: map[string]resourceapi.Device{}, counters: map[string]map[string]resourceapi.Counter{}}
	for _, p := range res.Pools {
		for _, s := range p.Slices {
			for _, d := range s.Devices {
				m.devices[d.Name] = d
			}
			for _, cs := range s.SharedCounters {
				m.counters[cs.Name] = cs.Counters
			}
		}
	}
	return m
}

// namedSlices renders resources as stored slices, with names.
func namedSlices(res resourceslice.DriverResources, node string) []*resourceapi.ResourceSlice {
	out := devicemodel.ResourceSlices(res, driverName, node)
	for i, s := range out {
		s.Name = s.GenerateName + string(rune('a'+i))
	}
	return out
}
