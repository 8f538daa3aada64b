package devicemodel_test

import (
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const driverName = vocabulary.DriverName

// cluster simulates one node per machine, named after the machine.
func cluster(t *testing.T, machines ...string) (*at.Cluster, map[string]*simnode.Node) {
	t.Helper()
	nodes := map[string]*simnode.Node{}
	var all []*resourceapi.ResourceSlice
	for _, m := range machines {
		n := simnode.New(t, m, m)
		nodes[m] = n
		for i, s := range n.Slices(driverName) {
			s.Name = s.GenerateName + string(rune('a'+i))
			all = append(all, s)
		}
	}
	return at.NewCluster(all, deviceclass.DeviceClasses(driverName)), nodes
}

func attr(name resourceapi.QualifiedName) resourceapi.FullyQualifiedName {
	if strings.Contains(string(name), "/") {
		return resourceapi.FullyQualifiedName(name)
	}
	return resourceapi.FullyQualifiedName(driverName + "/" + string(name))
}

// whole GPU requests against the published whole-GPU model.
func TestAllocateWholeGPUs(t *testing.T) {
	t.Run("one GPU", func(t *testing.T) {
		c, _ := cluster(t, "dgxh100")
		got := c.MustAllocate(t, "dgxh100", at.Claim("one", at.Exactly("gpu", driverName, 1)))
		if d := at.Devices(got[0]); len(d) != 1 || !strings.HasPrefix(d[0], "gpu-") {
			t.Errorf("allocated %v, want one gpu-N device", d)
		}
	})

	t.Run("8 GPUs fill a DGX, a 9th does not fit", func(t *testing.T) {
		c, _ := cluster(t, "dgxh100")
		seen := map[string]bool{}
		for i := range 8 {
			got := c.MustAllocate(t, "dgxh100", at.Claim("c", at.Exactly("gpu", driverName, 1)))
			dev := at.Devices(got[0])[0]
			if seen[dev] {
				t.Fatalf("claim %d got %s twice", i, dev)
			}
			seen[dev] = true
		}
		c.MustNotFit(t, "dgxh100", at.Claim("ninth", at.Exactly("gpu", driverName, 1)))
	})

	t.Run("product selection by CEL", func(t *testing.T) {
		c, _ := cluster(t, "dgxa100", "dgxh100")
		h100 := `device.attributes["gpu.dra.dev"].productName.startsWith("NVIDIA H100")`
		c.MustNotFit(t, "dgxa100", at.Claim("h100-on-a100", at.Exactly("gpu", driverName, 1, h100)))
		c.MustAllocate(t, "dgxh100", at.Claim("h100", at.Exactly("gpu", driverName, 1, h100)))
	})

	t.Run("memory at least 80Gi", func(t *testing.T) {
		c, _ := cluster(t, "dgxa100", "dgxh200")
		big := `device.capacity["gpu.dra.dev"].memory.compareTo(quantity("80Gi")) >= 0`
		c.MustNotFit(t, "dgxa100", at.Claim("big-on-a100", at.Exactly("gpu", driverName, 1, big)))
		c.MustAllocate(t, "dgxh200", at.Claim("big", at.Exactly("gpu", driverName, 1, big)))
	})

	t.Run("two GPUs on one NUMA node", func(t *testing.T) {
		c, nodes := cluster(t, "dgxh100")
		got := c.MustAllocate(t, "dgxh100", at.WithConstraints(
			at.Claim("pair", at.Exactly("gpu", driverName, 2)),
			at.MatchAttribute(attr(vocabulary.AttrNUMANode))))
		numa := map[int]bool{}
		for _, name := range at.Devices(got[0]) {
			numa[gpuByName(t, nodes["dgxh100"], name).NUMANode] = true
		}
		if len(numa) != 1 {
			t.Errorf("pair spans NUMA nodes %v", numa)
		}
		// Four GPUs per NUMA node: five on one node cannot exist.
		c.MustNotFit(t, "dgxh100", at.WithConstraints(
			at.Claim("five", at.Exactly("gpu", driverName, 5)),
			at.MatchAttribute(attr(vocabulary.AttrNUMANode))))
	})

	t.Run("firstAvailable H200 else H100", func(t *testing.T) {
		c, _ := cluster(t, "dgxh100", "dgxh200")
		claim := func() *resourceapi.ResourceClaim {
			return at.Claim("pref", at.FirstAvailable("gpu",
				at.Sub("h200", driverName, 1, `device.attributes["gpu.dra.dev"].productName.startsWith("NVIDIA H200")`),
				at.Sub("h100", driverName, 1, `device.attributes["gpu.dra.dev"].productName.startsWith("NVIDIA H100")`)))
		}
		onH200 := c.MustAllocate(t, "dgxh200", claim())
		onH100 := c.MustAllocate(t, "dgxh100", claim())
		if r := onH200[0].Status.Allocation.Devices.Results[0].Request; r != "gpu/h200" {
			t.Errorf("on the H200 node got request %q, want gpu/h200", r)
		}
		if r := onH100[0].Status.Allocation.Devices.Results[0].Request; r != "gpu/h100" {
			t.Errorf("on the H100 node got request %q, want gpu/h100", r)
		}
	})

	t.Run("two GPUs on one NVLink domain", func(t *testing.T) {
		for _, machine := range []string{"dgxa100", "dgxh100"} {
			c, nodes := cluster(t, machine)
			got := c.MustAllocate(t, machine, at.WithConstraints(
				at.Claim("nvl", at.Exactly("gpu", driverName, 2)),
				at.MatchAttribute(attr(vocabulary.AttrNVLinkDomain))))
			var domains []string
			for _, name := range at.Devices(got[0]) {
				domains = append(domains, gpuByName(t, nodes[machine], name).NVLinkDomain)
			}
			if domains[0] == "" || domains[0] != domains[1] {
				t.Errorf("%s: NVLink domains %v, want one non-empty domain", machine, domains)
			}
		}
		// PCIe cards have no NVLink: the constraint cannot be met.
		c, _ := cluster(t, "l4x4")
		c.MustNotFit(t, "l4x4", at.WithConstraints(
			at.Claim("nvl", at.Exactly("gpu", driverName, 2)),
			at.MatchAttribute(attr(vocabulary.AttrNVLinkDomain))))
	})
}

func gpuByName(t *testing.T, n *simnode.Node, name string) *discovery.GPU {
	t.Helper()
	i := slices.IndexFunc(n.GPUs, func(g discovery.GPU) bool { return g.CanonicalName() == name })
	if i < 0 {
		t.Fatalf("no GPU %s on %s", name, n.Name)
	}
	return &n.GPUs[i]
}

// BenchmarkAllocate is the scheduler's allocator time for one claim on a
// dgxh100 node with 4 of 8 GPUs held, on the full model (whole GPUs, MIG
// placements, shares: 224 devices and 8 counter sets) and on a whole-GPU-only
// model (8 devices), in the same run.
func BenchmarkAllocate(b *testing.B) {
	off := false
	wholeOnly := devicemodel.Policy{Default: devicemodel.GPUPolicy{
		MIG:         devicemodel.MIGOff,
		TimeSlicing: &devicemodel.SharePolicy{Enabled: &off},
		MPS:         &devicemodel.SharePolicy{Enabled: &off},
	}}
	twoProfiles := devicemodel.Policy{Default: devicemodel.GPUPolicy{MIGProfiles: []string{"1g.10gb", "3g.40gb"}}}
	for _, tc := range []struct {
		name   string
		policy devicemodel.Policy
		req    resourceapi.DeviceRequest
	}{
		{"whole-only-model/gpu", wholeOnly, at.Exactly("gpu", driverName, 1)},
		{"full-model/gpu", devicemodel.Policy{}, at.Exactly("gpu", driverName, 1)},
		{"full-model/mig-1g", devicemodel.Policy{}, at.Exactly("mig", "mig."+driverName, 1, `device.attributes["gpu.dra.dev"].profile == "1g.10gb"`)},
		{"full-model/timeslice", devicemodel.Policy{}, at.Exactly("ts", "timeslice."+driverName, 1)},
		// What an operator who hands out two MIG profiles publishes.
		{"two-mig-profiles/gpu", twoProfiles, at.Exactly("gpu", driverName, 1)},
		{"two-mig-profiles/mig-1g", twoProfiles, at.Exactly("mig", "mig."+driverName, 1, `device.attributes["gpu.dra.dev"].profile == "1g.10gb"`)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			n := simnode.New(b, "dgxh100", "dgxh100")
			n.Resources = devicemodel.Build(n.GPUs, devicemodel.Options{NodeName: "dgxh100", Policy: tc.policy})
			slices := n.Slices(driverName)
			for i, s := range slices {
				s.Name = s.GenerateName + string(rune('a'+i))
			}
			c := at.NewCluster(slices, deviceclass.DeviceClasses(driverName))
			for range 4 {
				c.MustAllocate(b, "dgxh100", at.Claim("held", at.Exactly("gpu", driverName, 1)))
			}
			held := len(c.Allocated)
			ctx := b.Context()
			b.ResetTimer()
			for range b.N {
				out, err := c.Allocate(ctx, "dgxh100", at.Claim("bench", tc.req))
				if err != nil || out == nil {
					b.Fatalf("allocate: %v", err)
				}
				c.Allocated = c.Allocated[:held]
			}
		})
	}
}
