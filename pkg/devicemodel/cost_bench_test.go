package devicemodel_test

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/reserve"
)

// costFills are the fill levels of issue #14's allocator goal: k of the
// node's 8 GPUs already held whole by earlier claims, up to the full node.
const costFills = 8

// costKinds are the claims whose cost the goal bounds, on the full model.
var costKinds = []struct {
	name string
	req  resourceapi.DeviceRequest
	goal float64 // full ÷ whole-only, averaged over the fill levels
}{
	{"gpu", at.Exactly("gpu", driverName, 1), 1.5},
	{"mig-1g", at.Exactly("mig", "mig."+driverName, 1, at.Profile("1g.10gb")), 3},
	{"timeslice", at.Exactly("ts", "timeslice."+driverName, 1), 3},
	{"mps", at.Exactly("mps", "mps."+driverName, 1), 3},
}

// wholeGPUOnly publishes the 8 whole GPUs of a DGX H100 and nothing else:
// no MIG placements and no shares of either strategy.
func wholeGPUOnly() devicemodel.Policy {
	off := false
	return devicemodel.Policy{Default: devicemodel.GPUPolicy{
		MIG:         devicemodel.MIGOff,
		TimeSlicing: &devicemodel.SharePolicy{Enabled: &off},
		MPS:         &devicemodel.SharePolicy{Enabled: &off},
	}}
}

// costCluster is node n publishing resources with fill GPUs held whole.
// With withdraw, the node has prepared the held claims and republished
// without what they make impossible to allocate (devicemodel.Withdraw).
func costCluster(b *testing.B, n *simnode.Node, resources resourceslice.DriverResources, fill int, withdraw bool) *at.Cluster {
	b.Helper()
	c := at.NewCluster(namedSlices(resources, n.Name), deviceclass.DeviceClasses(driverName))
	prepared := map[string]bool{}
	for i := range fill {
		got := c.MustAllocate(b, n.Name, at.Claim(fmt.Sprintf("held-%d", i), at.Exactly("gpu", driverName, 1)))
		for _, d := range at.Devices(got[0]) {
			prepared[d] = true
		}
	}
	if withdraw {
		c.Slices = namedSlices(devicemodel.Withdraw(resources, n.Name, prepared), n.Name)
	}
	return c
}

// timeAllocate is one allocator call for a fresh claim of req; whatever it
// allocates is released again so every call sees the same node.
func timeAllocate(b *testing.B, c *at.Cluster, node string, req resourceapi.DeviceRequest) time.Duration {
	return clockAllocate(b, c, node, req, func() time.Duration { return time.Duration(time.Now().UnixNano()) })
}

// clockAllocate is timeAllocate on the given clock.
func clockAllocate(b *testing.B, c *at.Cluster, node string, req resourceapi.DeviceRequest, clock func() time.Duration) time.Duration {
	held := len(c.Allocated)
	claim := at.Claim("bench", req)
	start := clock()
	if _, err := c.Allocate(b.Context(), node, claim); err != nil {
		b.Fatalf("allocate: %v", err)
	}
	d := clock() - start
	c.Allocated = c.Allocated[:held]
	return d
}

// BenchmarkAllocatorCost is issue #14's allocator goal: the upstream
// allocator's cost per claim on one DGX H100 node, full model (224 devices)
// ÷ whole-GPU-only model (8 devices), at fill levels 0..8, one
// sub-benchmark per fill level. Each model is timed in phases of its own
// (phased): a forced GC, then a block of rounds of that model's calls alone,
// so each model pays the garbage collection of its own garbage only (timed
// back to back, a cheap call after the full model's garbage-heavy calls
// paid their GC: 2.4× for a withdrawn full node that equals the baseline,
// 1.0× alone). The phases of all models take turns, block by block, so load
// from other processes falls on every side of a ratio, and ratios are of
// the median calls, so a preempted call does not decide them. The
// denominator is always a whole-GPU claim on the
// whole-GPU-only model: that model has no MIG devices or shares, and what
// the goal prices is the full model against a node that publishes whole
// GPUs only. A claim that does not fit (every kind at fill 8, MIG and
// shares never on a fully held node) is timed too: that is the Filter call
// the scheduler makes on a full node.
//
// The full model is timed twice: as published before withdrawal (every
// device, whatever is held) and as the node publishes it once it has
// prepared the held claims and withdrawn what they make impossible to
// allocate (docs/device-model.md, "What is published when"). The reserve
// policy with K=1 and K=2 spare GPUs is timed after withdrawal (issue
// #26; docs/device-model.md, "Reserve policy"): the held GPUs publish
// their whole GPU only, K free GPUs everything, the others their whole GPU.
//
// Per fill level: whole-only-us, the median whole-only call; <kind>-x, full
// ÷ whole-only; <kind>-w-x, full with withdrawal ÷ whole-only; <kind>-r1-x
// and <kind>-r2-x, reserve K=1 and K=2 ÷ whole-only. The parent logs the
// ratios averaged over the fill levels against the goals.
func BenchmarkAllocatorCost(b *testing.B) {
	n := simnode.New(b, "dgxh100", "dgxh100")
	ratios := make([][]float64, costFills+1) // [fill][model*len(costKinds)+kind]
	for k := range costFills + 1 {
		b.Run(fmt.Sprintf("fill=%d", k), func(b *testing.B) {
			ratios[k] = costAtFill(b, n, k)
		})
	}
	if ratios[costFills] == nil {
		return // filtered by -bench
	}
	var sum strings.Builder
	for model, m := range costModels {
		fmt.Fprintf(&sum, "\n%s ÷ whole-GPU-only model, averaged over fill levels 0..%d:", m.title, costFills)
		for i, kind := range costKinds {
			j := model*len(costKinds) + i
			var avg float64
			for k := range costFills + 1 {
				avg += ratios[k][j] / float64(costFills+1)
			}
			goal := ""
			if g := m.goal(i); g > 0 {
				met := "not met"
				if avg <= g {
					met = "met"
				}
				goal = fmt.Sprintf("  goal ≤ %.1f×: %s", g, met)
			}
			fmt.Fprintf(&sum, "\n  %-9s %6.1f×  (empty node %6.1f×, full node %6.1f×)%s", kind.name, avg, ratios[0][j], ratios[costFills][j], goal)
		}
	}
	b.Log(sum.String())
}

// costModels are the models BenchmarkAllocatorCost times against the
// whole-GPU-only one: what each publishes with fill GPUs held whole, the
// suffix of its per-fill metrics, and its goal per claim kind (0: none).
var costModels = []struct {
	title, suffix string
	withdraw      bool
	spares        int // reserve policy's K; 0: off
	goal          func(kind int) float64
}{
	{"full model", "-x", false, 0, func(kind int) float64 { return costKinds[kind].goal }},
	{"full model with withdrawal", "-w-x", true, 0, func(int) float64 { return 0 }},
	// Issue #26: lean counters and reserve K=1 within 1.5× per whole-GPU claim.
	{"reserve K=1 with withdrawal", "-r1-x", true, 1, func(kind int) float64 { return map[int]float64{0: 1.5}[kind] }},
	{"reserve K=2 with withdrawal", "-r2-x", true, 2, func(int) float64 { return 0 }},
}

// costAtFill times the calls at one fill level and returns full ÷
// whole-only per kind, then full with withdrawal ÷ whole-only per kind.
func costAtFill(b *testing.B, n *simnode.Node, fill int) []float64 {
	base := costCluster(b, n, build(n, wholeGPUOnly()), fill, false)
	full := build(n, devicemodel.Policy{})
	phases := [][]func() time.Duration{{func() time.Duration { return timeAllocate(b, base, n.Name, costKinds[0].req) }}}
	for _, m := range costModels {
		c := costCluster(b, n, full, fill, m.withdraw)
		if m.spares > 0 {
			reserveCluster(b, n, c, full, m.spares)
		}
		var calls []func() time.Duration
		for _, kind := range costKinds {
			calls = append(calls, func() time.Duration { return timeAllocate(b, c, n.Name, kind.req) })
		}
		phases = append(phases, calls)
	}
	ns := slices.Concat(phased(b, phases, costBlock)...)
	baseMedian := median(ns[0])
	b.ReportMetric(float64(baseMedian.Nanoseconds())/1e3, "whole-only-us")
	ns = ns[1:]
	out := make([]float64, len(ns))
	for j := range ns {
		out[j] = float64(median(ns[j])) / float64(baseMedian)
		b.ReportMetric(out[j], costKinds[j%len(costKinds)].name+costModels[j/len(costKinds)].suffix)
	}
	return out
}

// reserveCluster has c, whose held claims node n has prepared, publish
// what n publishes under the reserve policy with k spare GPUs (once the
// start hold is over), after withdrawal.
func reserveCluster(b *testing.B, n *simnode.Node, c *at.Cluster, full resourceslice.DriverResources, k int) {
	b.Helper()
	held := map[string]bool{}
	for _, claim := range c.Allocated {
		for _, d := range at.Devices(claim) {
			held[d] = true
		}
	}
	tracker, err := reserve.New(b.Context(), reserve.Options{Policy: devicemodel.ReservePolicy{SpareGPUs: k}, Hold: -1})
	if err != nil {
		b.Fatal(err)
	}
	hidden, _ := tracker.Hide(b.Context(), full, n.Name, held)
	c.Slices = namedSlices(devicemodel.Withdraw(hidden, n.Name, held), n.Name)
}

// build is node n's resources under policy.
func build(n *simnode.Node, policy devicemodel.Policy) resourceslice.DriverResources {
	return devicemodel.Build(n.GPUs, devicemodel.Options{NodeName: n.Name, Policy: policy})
}

// costBlock is the number of rounds of one model's calls between two
// forced collections: long enough that a phase's own garbage triggers its
// own GC cycles, short enough that the models take turns many times in a
// run.
const costBlock = 20

// phased makes each call once to warm the CEL cache and the allocator's
// lazily built state, then b.N rounds of every call, in blocks: per block
// each phase in turn gets a forced GC (outside the timed calls) and then
// block rounds of its calls alone, interleaved among themselves. Garbage
// one phase leaves is collected before the next phase starts, so a
// phase's calls pay only the collections of their own garbage, and the
// blocks spread load from other processes over all phases alike. It
// returns each call's durations, per phase.
func phased(b *testing.B, phases [][]func() time.Duration, block int) [][][]time.Duration {
	ns := make([][][]time.Duration, len(phases))
	for p, calls := range phases {
		for _, call := range calls {
			call()
		}
		ns[p] = make([][]time.Duration, len(calls))
	}
	b.ResetTimer()
	for done := 0; done < b.N; done += block {
		rounds := min(block, b.N-done)
		for p, calls := range phases {
			b.StopTimer()
			runtime.GC()
			b.StartTimer()
			for range rounds {
				for i, call := range calls {
					ns[p][i] = append(ns[p][i], call())
				}
			}
		}
	}
	b.StopTimer()
	return ns
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
