package devicemodel_test

import (
	"context"
	"fmt"
	"runtime/debug"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Scenarios of upstream allocator bugs on the paths this model relies on:
// shared counters (every device of a GPU consumes its counter set) together
// with multi-allocatable share devices. Each runs the allocator at the
// version in go.mod over our published slices and DeviceClasses;
// docs/device-model.md ("Minimum Kubernetes versions") lists the first
// patch releases that carry each fix. The allocator harness starts a fresh
// allocator per Allocate call, as the scheduler does per scheduling cycle,
// so what earlier claims hold comes from their persisted allocation results.

// allocateNoPanic is Allocate with a panic turned into a test failure naming
// the upstream bug, so one panicking scenario does not take the rest down.
func allocateNoPanic(t *testing.T, c *at.Cluster, bug string, claims ...*resourceapi.ResourceClaim) (out []*resourceapi.ResourceClaim, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("allocator panicked (%s): %v\n%s", bug, r, debug.Stack())
		}
	}()
	return c.Allocate(context.Background(), "dgxh100", claims...)
}

func allOf(name, class string, cel ...string) resourceapi.DeviceRequest {
	r := at.Exactly(name, class, 0, cel...)
	r.Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
	return r
}

// kubernetes#139034 (fixed by #139040, 1.36 cherry-pick #139211): a fresh
// allocator rebuilt the available counters from dedicated allocations only,
// so the counters consumed by a committed share (recorded by share ID and
// consumed capacity, not as an allocated device) looked free in the next
// scheduling cycle: the whole GPU, its MIG devices or the other strategy's
// share could be allocated while the GPU was shared — a double allocation.
func TestUpstream139034NoDoubleAllocationBesideAShare(t *testing.T) {
	exclusive := map[string]resourceapi.DeviceRequest{
		"whole":     onGPU0("gpu"),
		"mig 1g":    onGPU0("mig", at.Profile("1g.10gb")),
		"mig 7g":    onGPU0("mig", at.Profile("7g.80gb")),
		"timeslice": onGPU0("timeslice"),
		"mps":       onGPU0("mps"),
	}
	for _, share := range []string{"timeslice", "mps"} {
		for name, req := range exclusive {
			if name == share {
				continue // the same strategy shares, by design
			}
			t.Run(share+" share then "+name, func(t *testing.T) {
				c, _ := cluster(t, "dgxh100")
				c.MustAllocate(t, "dgxh100", at.Claim("share", onGPU0(share)))
				c.MustNotFit(t, "dgxh100", at.Claim("second", req))
			})
		}
	}

	// Node-wide: with a share on every GPU, no claim of another kind fits
	// anywhere on the node, and every GPU's share device is still usable.
	t.Run("a share on every GPU leaves nothing exclusive", func(t *testing.T) {
		c, _ := cluster(t, "dgxh100")
		for minor := range 8 {
			c.MustAllocate(t, "dgxh100", at.Claim(fmt.Sprintf("ts-%d", minor),
				at.Exactly("r", "timeslice."+driverName, 1, fmt.Sprintf(`device.attributes["gpu.dra.dev"].minor == %d`, minor))))
		}
		c.MustNotFit(t, "dgxh100", at.Claim("whole", at.Exactly("gpu", driverName, 1)))
		c.MustNotFit(t, "dgxh100", at.Claim("mig", at.Exactly("mig", "mig."+driverName, 1)))
		c.MustNotFit(t, "dgxh100", at.Claim("mps", at.Exactly("mps", "mps."+driverName, 1)))
		c.MustAllocate(t, "dgxh100", at.Claim("ts-again", at.Exactly("r", "timeslice."+driverName, 1)))
	})
}

// kubernetes#140433 (fixed by #140437; its 1.36 cherry-pick #140773 was
// closed unmerged): a device that allows multiple allocations and consumes
// counters — exactly our share devices — had its counters charged a second
// time by the next share when the persisted share carried a share ID but no
// consumed capacity, and the claim failed with a false "insufficient
// counters". Our shares always carry consumed capacity (each capacity has a
// request policy), which the scheduler records and which already skipped
// the recharge; the second case reproduces the upstream report's state.
func TestUpstream140433NoFalseInsufficientCounters(t *testing.T) {
	for _, tc := range []struct {
		name            string
		dropConsumedCap bool
	}{
		{"shares as the scheduler records them", false},
		{"persisted share without consumed capacity", true},
	} {
		for _, kind := range []string{"timeslice", "mps"} {
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				c, _ := cluster(t, "dgxh100")
				first := c.MustAllocate(t, "dgxh100", at.Claim("s0", onGPU0(kind)))
				if tc.dropConsumedCap {
					for i := range first[0].Status.Allocation.Devices.Results {
						first[0].Status.Allocation.Devices.Results[i].ConsumedCapacity = nil
					}
				}
				// Each later share runs in a fresh allocator, as in a later
				// scheduling cycle; the GPU's counters are held once.
				for i := 1; i < devicemodel.DefaultMaxShares; i++ {
					out, err := allocateNoPanic(t, c, "kubernetes#140433", at.Claim(fmt.Sprintf("s%d", i), onGPU0(kind)))
					if err != nil || out == nil {
						t.Fatalf("share %d of GPU 0 did not allocate (err %v): counters charged twice, kubernetes#140433, fixed in 1.37.0", i, err)
					}
				}
				// Still exclusive against every other use of the GPU.
				c.MustNotFit(t, "dgxh100", at.Claim("whole", onGPU0("gpu")))
			})
		}
	}
}

// kubernetes#140431 (1.36 cherry-pick #140663), the same false "insufficient
// counters" from the search side: a candidate rejected by a claim
// constraint after its counters were reserved kept them reserved, so the
// allocator later treated a free GPU's counter set as exhausted.
func TestUpstream140431RejectedCandidateReleasesCounters(t *testing.T) {
	c, nodes := cluster(t, "dgxh100")
	n := nodes["dgxh100"]
	// Leave one free GPU on NUMA node 0 (the first in publication order)
	// and four on NUMA node 1: the pair must come from NUMA node 1, after
	// the search has tried and rejected the NUMA node 1 GPUs beside the
	// NUMA node 0 one.
	var numa0 []int
	for _, g := range n.GPUs {
		if g.NUMANode == n.GPUs[0].NUMANode {
			numa0 = append(numa0, g.Minor)
		}
	}
	if len(numa0) < 2 || len(numa0) == len(n.GPUs) {
		t.Fatalf("dgxh100 GPUs on NUMA node %d: %v, want some but not all", n.GPUs[0].NUMANode, numa0)
	}
	for _, minor := range numa0[1:] {
		c.MustAllocate(t, "dgxh100", at.Claim(fmt.Sprintf("held-%d", minor),
			at.Exactly("gpu", driverName, 1, fmt.Sprintf(`device.attributes["gpu.dra.dev"].minor == %d`, minor))))
	}
	out, err := allocateNoPanic(t, c, "kubernetes#140431", at.WithConstraints(
		at.Claim("pair", at.Exactly("gpu", driverName, 2)),
		at.MatchAttribute(attr(vocabulary.AttrNUMANode))))
	if err != nil || out == nil {
		t.Fatalf("a same-NUMA pair did not allocate although one NUMA node has %d free GPUs (err %v): leaked counter reservation, kubernetes#140431, fixed in 1.36.3 and 1.37.0",
			len(n.GPUs)-len(numa0), err)
	}
	for _, name := range at.Devices(out[0]) {
		if g := gpuByName(t, n, name); g.NUMANode == n.GPUs[0].NUMANode {
			t.Errorf("pair got %s on the NUMA node with one free GPU", name)
		}
	}
}

// kubernetes#138882 (fixed by #138885; cherry-picks #138988 for 1.36 and
// #138989 for 1.35): allocationMode All over devices that consume counters
// dereferenced a nil pool and panicked kube-scheduler in Filter.
func TestUpstream138882AllocationModeAllWithCounters(t *testing.T) {
	for _, tc := range []struct {
		name  string
		req   resourceapi.DeviceRequest
		want  int // devices allocated; 0: must not fit
		setup func(t *testing.T, c *at.Cluster)
	}{
		{name: "all whole GPUs", req: allOf("gpu", driverName), want: 8},
		{name: "all 1g.10gb placements of GPU 0", req: allOf("mig", "mig."+driverName,
			`device.attributes["gpu.dra.dev"].parentMinor == 0`, at.Profile("1g.10gb")), want: 7},
		{name: "all MIG devices of GPU 0 overlap", req: allOf("mig", "mig."+driverName,
			`device.attributes["gpu.dra.dev"].parentMinor == 0`)},
		{name: "all whole GPUs while GPU 0 is shared", req: allOf("gpu", driverName),
			setup: func(t *testing.T, c *at.Cluster) {
				c.MustAllocate(t, "dgxh100", at.Claim("ts", onGPU0("timeslice")))
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := cluster(t, "dgxh100")
			if tc.setup != nil {
				tc.setup(t, c)
			}
			out, err := allocateNoPanic(t, c, "kubernetes#138882, fixed in 1.36.2 and 1.37.0", at.Claim("all", tc.req))
			if err != nil {
				t.Fatalf("allocate: %v", err)
			}
			switch {
			case tc.want == 0 && out != nil:
				t.Fatalf("allocated %v, expected the claim not to fit", at.Devices(out[0]))
			case tc.want > 0 && out == nil:
				t.Fatalf("claim did not fit, expected %d devices", tc.want)
			case tc.want > 0 && len(at.Devices(out[0])) != tc.want:
				t.Fatalf("allocated %v, want %d devices", at.Devices(out[0]), tc.want)
			}
		})
	}
}
