package devicemodel_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
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

// costCluster is a dgxh100 node under policy with fill GPUs held whole.
func costCluster(b *testing.B, n *simnode.Node, policy devicemodel.Policy, fill int) *at.Cluster {
	b.Helper()
	resources := devicemodel.Build(n.GPUs, devicemodel.Options{NodeName: n.Name, Policy: policy})
	slices := devicemodel.ResourceSlices(resources, driverName, n.Name)
	for i, s := range slices {
		s.Name = s.GenerateName + string(rune('a'+i))
	}
	c := at.NewCluster(slices, deviceclass.DeviceClasses(driverName))
	for i := range fill {
		c.MustAllocate(b, n.Name, at.Claim(fmt.Sprintf("held-%d", i), at.Exactly("gpu", driverName, 1)))
	}
	return c
}

// timeAllocate is one allocator call for a fresh claim of req; whatever it
// allocates is released again so every call sees the same node.
func timeAllocate(b *testing.B, c *at.Cluster, node string, req resourceapi.DeviceRequest) time.Duration {
	held := len(c.Allocated)
	claim := at.Claim("bench", req)
	start := time.Now()
	if _, err := c.Allocate(b.Context(), node, claim); err != nil {
		b.Fatalf("allocate: %v", err)
	}
	d := time.Since(start)
	c.Allocated = c.Allocated[:held]
	return d
}

// BenchmarkAllocatorCost is issue #14's allocator goal: the upstream
// allocator's cost per claim on one DGX H100 node, full model (224 devices)
// ÷ whole-GPU-only model (8 devices), at fill levels 0..8, one
// sub-benchmark per fill level. Each iteration makes one call per model and
// claim kind, interleaved so load from other processes falls on both sides
// of each ratio, and ratios are of the median calls, so a preempted call
// does not decide them. The denominator is always a whole-GPU claim on the
// whole-GPU-only model: that model has no MIG devices or shares, and what
// the goal prices is the full model against a node that publishes whole
// GPUs only. A claim that does not fit (every kind at fill 8, MIG and
// shares never on a fully held node) is timed too: that is the Filter call
// the scheduler makes on a full node.
//
// Per fill level: whole-only-us, the median whole-only call, and <kind>-x,
// full ÷ whole-only. The parent logs the ratios averaged over the fill
// levels against the goals.
func BenchmarkAllocatorCost(b *testing.B) {
	n := simnode.New(b, "dgxh100", "dgxh100")
	ratios := make([][]float64, costFills+1) // [fill][kind]
	for k := range costFills + 1 {
		b.Run(fmt.Sprintf("fill=%d", k), func(b *testing.B) {
			ratios[k] = costAtFill(b, n, k)
		})
	}
	if ratios[costFills] == nil {
		return // filtered by -bench
	}
	var sum strings.Builder
	fmt.Fprintf(&sum, "full model ÷ whole-GPU-only model, averaged over fill levels 0..%d:", costFills)
	for i, kind := range costKinds {
		var avg float64
		for k := range costFills + 1 {
			avg += ratios[k][i] / float64(costFills+1)
		}
		met := "not met"
		if avg <= kind.goal {
			met = "met"
		}
		fmt.Fprintf(&sum, "\n  %-9s %6.1f×  (full node %6.1f×)  goal ≤ %.1f×: %s", kind.name, avg, ratios[costFills][i], kind.goal, met)
	}
	b.Log(sum.String())
}

// costAtFill times the calls at one fill level and returns full ÷
// whole-only per kind.
func costAtFill(b *testing.B, n *simnode.Node, fill int) []float64 {
	base := costCluster(b, n, wholeGPUOnly(), fill)
	full := costCluster(b, n, devicemodel.Policy{}, fill)
	wholeReq := costKinds[0].req
	// Warm the CEL cache and the allocator's lazily built state.
	timeAllocate(b, base, n.Name, wholeReq)
	for _, kind := range costKinds {
		timeAllocate(b, full, n.Name, kind.req)
	}
	baseNs := make([]time.Duration, 0, b.N)
	fullNs := make([][]time.Duration, len(costKinds))
	b.ResetTimer()
	for range b.N {
		baseNs = append(baseNs, timeAllocate(b, base, n.Name, wholeReq))
		for i, kind := range costKinds {
			fullNs[i] = append(fullNs[i], timeAllocate(b, full, n.Name, kind.req))
		}
	}
	b.StopTimer()
	baseMedian := median(baseNs)
	b.ReportMetric(float64(baseMedian.Nanoseconds())/1e3, "whole-only-us")
	out := make([]float64, len(costKinds))
	for i, kind := range costKinds {
		out[i] = float64(median(fullNs[i])) / float64(baseMedian)
		b.ReportMetric(out[i], kind.name+"-x")
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
