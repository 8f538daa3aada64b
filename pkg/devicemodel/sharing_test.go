package devicemodel_test

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// Requests pinned to GPU 0, one per way of using it.
func onGPU0(kind string, extra ...string) resourceapi.DeviceRequest {
	sel := map[string]string{
		"gpu":       `device.attributes["gpu.dra.dev"].minor == 0`,
		"mig":       `device.attributes["gpu.dra.dev"].parentMinor == 0`,
		"timeslice": `device.attributes["gpu.dra.dev"].minor == 0`,
		"mps":       `device.attributes["gpu.dra.dev"].minor == 0`,
	}[kind]
	class := driverName
	if kind != "gpu" {
		class = kind + "." + driverName
	}
	return at.Exactly("r", class, 1, append([]string{sel}, extra...)...)
}

// The scheduler itself rules out every conflicting use of one GPU.
func TestOneGPUOneWayOfUse(t *testing.T) {
	uses := []struct {
		name string
		req  resourceapi.DeviceRequest
	}{
		{"whole", onGPU0("gpu")},
		{"mig", onGPU0("mig", at.Profile("1g.10gb"))},
		{"timeslice", onGPU0("timeslice")},
		{"mps", onGPU0("mps")},
	}
	for _, first := range uses {
		for _, second := range uses {
			t.Run(first.name+" then "+second.name, func(t *testing.T) {
				c, _ := cluster(t, "dgxh100")
				c.MustAllocate(t, "dgxh100", at.Claim("first", first.req))
				// Sharing with the same strategy, or a second MIG device,
				// is the only combination a GPU allows.
				if first.name == second.name && first.name != "whole" {
					c.MustAllocate(t, "dgxh100", at.Claim("second", second.req))
				} else {
					c.MustNotFit(t, "dgxh100", at.Claim("second", second.req))
				}
			})
		}
	}
}

func TestReleaseFreesTheGPU(t *testing.T) {
	c, _ := cluster(t, "dgxh100")
	ts := c.MustAllocate(t, "dgxh100", at.Claim("ts", onGPU0("timeslice")))
	c.MustNotFit(t, "dgxh100", at.Claim("whole", onGPU0("gpu")))
	c.Release(ts[0])
	c.MustAllocate(t, "dgxh100", at.Claim("whole", onGPU0("gpu")))
}

func TestShareCount(t *testing.T) {
	for _, kind := range []string{"timeslice", "mps"} {
		t.Run(kind, func(t *testing.T) {
			c, _ := cluster(t, "dgxh100")
			for i := range 4 { // DefaultMaxShares
				c.MustAllocate(t, "dgxh100", at.Claim(fmt.Sprintf("s%d", i), onGPU0(kind)))
			}
			c.MustNotFit(t, "dgxh100", at.Claim("fifth", onGPU0(kind)))
		})
	}
}

func TestShareCapacity(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		c, _ := cluster(t, "dgxh100")
		half := at.WithCapacity(onGPU0("mps"), map[string]string{"memory": "40G"})
		c.MustAllocate(t, "dgxh100", at.Claim("a", half))
		c.MustAllocate(t, "dgxh100", at.Claim("b", half))
		c.MustNotFit(t, "dgxh100", at.Claim("c", half))
	})
	t.Run("compute", func(t *testing.T) {
		c, _ := cluster(t, "dgxh100")
		half := at.WithCapacity(onGPU0("mps"), map[string]string{"compute": "50"})
		c.MustAllocate(t, "dgxh100", at.Claim("a", half))
		c.MustAllocate(t, "dgxh100", at.Claim("b", half))
		c.MustNotFit(t, "dgxh100", at.Claim("c", half))
	})
	t.Run("default share is 1/maxShares", func(t *testing.T) {
		c, _ := cluster(t, "dgxh100")
		got := c.MustAllocate(t, "dgxh100", at.Claim("a", onGPU0("timeslice")))
		consumed := got[0].Status.Allocation.Devices.Results[0].ConsumedCapacity
		if q := consumed["compute"]; q.Value() != 25 {
			t.Errorf("default compute share = %s, want 25", q.String())
		}
		if q := consumed["shares"]; q.Value() != 1 {
			t.Errorf("default shares = %s, want 1", q.String())
		}
	})
}

// MIG placements exhaust as they do on the hardware.
func TestMIGPlacements(t *testing.T) {
	tests := []struct {
		machine string
		fill    string
		n       int
		thenNot string
	}{
		{"dgxh100", "1g.10gb", 7, "2g.20gb"},
		{"dgxh100", "1g.10gb", 7, "1g.10gb"},
		{"dgxa100", "1g.5gb", 7, "2g.10gb"},
		{"dgxh100", "1g.20gb", 4, "1g.10gb"},
		{"dgxh100", "3g.40gb", 2, "1g.10gb"},
		{"dgxh100", "1g.10gb+me", 1, "1g.10gb+me"},
		{"dgxh100", "7g.80gb", 1, "1g.10gb"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s %d×%s then no %s", tc.machine, tc.n, tc.fill, tc.thenNot), func(t *testing.T) {
			c, _ := cluster(t, tc.machine)
			for i := range tc.n {
				c.MustAllocate(t, tc.machine, at.Claim(fmt.Sprintf("m%d", i), onGPU0("mig", at.Profile(tc.fill))))
			}
			c.MustNotFit(t, tc.machine, at.Claim("next", onGPU0("mig", at.Profile(tc.thenNot))))
		})
	}
}

// With migProfiles, only the listed profiles can be allocated, all their
// placements still fill the GPU, and the whole GPU and shares stay usable.
func TestMIGProfilesPolicyAllocation(t *testing.T) {
	n := simnode.New(t, "dgxh100", "dgxh100")
	policy := devicemodel.Policy{Default: devicemodel.GPUPolicy{MIGProfiles: []string{"1g.10gb", "3g.40gb"}}}
	n.Resources = devicemodel.Build(n.GPUs, devicemodel.Options{NodeName: "dgxh100", Policy: policy})
	slices := n.Slices(driverName)
	for i, s := range slices {
		s.Name = s.GenerateName + string(rune('a'+i))
	}
	c := at.NewCluster(slices, deviceclass.DeviceClasses(driverName))
	c.MustNotFit(t, "dgxh100", at.Claim("2g", onGPU0("mig", at.Profile("2g.20gb"))))
	c.MustAllocate(t, "dgxh100", at.Claim("3g", onGPU0("mig", at.Profile("3g.40gb"))))
	for i := range 4 { // 3 + 4 of 7 compute slices
		c.MustAllocate(t, "dgxh100", at.Claim(fmt.Sprintf("1g-%d", i), onGPU0("mig", at.Profile("1g.10gb"))))
	}
	c.MustNotFit(t, "dgxh100", at.Claim("1g-full", onGPU0("mig", at.Profile("1g.10gb"))))
	c.MustNotFit(t, "dgxh100", at.Claim("whole", onGPU0("gpu")))
	c.MustAllocate(t, "dgxh100", at.Claim("other", at.Exactly("gpu", driverName, 1)))
}

// First-fit packing keeps large placements free: a 1g fills from the top,
// so a 4g (only at slice 0) still fits, and then a 2g beside it.
func TestMIGPacking(t *testing.T) {
	c, _ := cluster(t, "dgxh100")
	for _, p := range []string{"1g.10gb", "4g.40gb", "2g.20gb"} {
		c.MustAllocate(t, "dgxh100", at.Claim(p, onGPU0("mig", at.Profile(p))))
	}
	c.MustNotFit(t, "dgxh100", at.Claim("full", onGPU0("mig", at.Profile("1g.10gb"))))
}
