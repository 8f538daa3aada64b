package devicemodel_test

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// policyCluster is cluster with one dgxh100 node published under policy.
func policyCluster(t *testing.T, policy devicemodel.Policy) *at.Cluster {
	t.Helper()
	n := simnode.New(t, "dgxh100", "dgxh100")
	n.Resources = devicemodel.Build(n.GPUs, devicemodel.Options{NodeName: "dgxh100", Policy: policy})
	slices := n.Slices(driverName)
	for i, s := range slices {
		s.Name = s.GenerateName + string(rune('a'+i))
	}
	return at.NewCluster(slices, deviceclass.DeviceClasses(driverName))
}

func passthroughPolicy() devicemodel.Policy {
	on := true
	return devicemodel.Policy{Default: devicemodel.GPUPolicy{Passthrough: &on}}
}

func TestVFIOPublishedOnlyByPolicy(t *testing.T) {
	n := simnode.New(t, "dgxh100", "dgxh100")
	on, off := true, false
	for name, tc := range map[string]struct {
		policy devicemodel.Policy
		want   []string
	}{
		"default":       {devicemodel.Policy{}, nil},
		"all":           {passthroughPolicy(), []string{"gpu-0-vfio", "gpu-1-vfio", "gpu-2-vfio", "gpu-3-vfio", "gpu-4-vfio", "gpu-5-vfio", "gpu-6-vfio", "gpu-7-vfio"}},
		"one GPU":       {devicemodel.Policy{GPUs: map[string]devicemodel.GPUPolicy{"1": {Passthrough: &on}}}, []string{"gpu-1-vfio"}},
		"all but GPU 0": {devicemodel.Policy{Default: devicemodel.GPUPolicy{Passthrough: &on}, GPUs: map[string]devicemodel.GPUPolicy{"0": {Passthrough: &off}}}, []string{"gpu-1-vfio", "gpu-2-vfio", "gpu-3-vfio", "gpu-4-vfio", "gpu-5-vfio", "gpu-6-vfio", "gpu-7-vfio"}},
	} {
		t.Run(name, func(t *testing.T) {
			published, _ := devicemodel.Model(n.GPUs, devicemodel.Options{NodeName: "n", Policy: tc.policy})
			var got []string
			for _, p := range published {
				if p.Kind == vocabulary.KindVFIO {
					got = append(got, p.Device.Name)
					if typ := p.Device.Attributes[vocabulary.AttrType].StringValue; typ == nil || *typ != string(vocabulary.KindVFIO) {
						t.Errorf("%s type %v, want vfio", p.Device.Name, typ)
					}
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("vfio devices %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("vfio devices %v, want %v", got, tc.want)
				}
			}
		})
	}
}

// The scheduler keeps a passthrough GPU apart from every other use of it, in both orders, and
// from nothing on another GPU.
func TestVFIOExcludesEveryOtherUse(t *testing.T) {
	vfio := at.Exactly("r", "vfio."+driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`)
	others := []struct {
		name string
		req  resourceapi.DeviceRequest
	}{
		{"whole", onGPU0("gpu")},
		{"mig", onGPU0("mig", at.Profile("1g.10gb"))},
		{"timeslice", onGPU0("timeslice")},
		{"mps", onGPU0("mps")},
		{"vfio", vfio},
	}
	for _, other := range others {
		t.Run("vfio then "+other.name, func(t *testing.T) {
			c := policyCluster(t, passthroughPolicy())
			c.MustAllocate(t, "dgxh100", at.Claim("vm", vfio))
			c.MustNotFit(t, "dgxh100", at.Claim("other", other.req))
		})
		t.Run(other.name+" then vfio", func(t *testing.T) {
			c := policyCluster(t, passthroughPolicy())
			c.MustAllocate(t, "dgxh100", at.Claim("other", other.req))
			c.MustNotFit(t, "dgxh100", at.Claim("vm", vfio))
		})
	}
	t.Run("another GPU", func(t *testing.T) {
		c := policyCluster(t, passthroughPolicy())
		c.MustAllocate(t, "dgxh100", at.Claim("vm", vfio))
		c.MustAllocate(t, "dgxh100", at.Claim("other", at.Exactly("r", driverName, 1, `device.attributes["gpu.dra.dev"].minor == 1`)))
	})
	t.Run("eight VMs fill a DGX", func(t *testing.T) {
		c := policyCluster(t, passthroughPolicy())
		for range 8 {
			c.MustAllocate(t, "dgxh100", at.Claim("vm", at.Exactly("r", "vfio."+driverName, 1)))
		}
		c.MustNotFit(t, "dgxh100", at.Claim("ninth", at.Exactly("r", driverName, 1)))
	})
}
