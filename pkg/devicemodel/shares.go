package devicemodel

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// ShareDevice is the shareable device of one strategy on a GPU: many claims
// can be allocated from it, each consuming shares, compute and memory. It
// consumes the GPU's whole (consumeWhole), so while any share exists the
// GPU cannot be allocated whole, as MIG devices or under the other strategy.
// Every share consumes some of each capacity, so each has a request policy:
// the allocator would give a share that requests nothing the whole of a
// capacity without one.
func ShareDevice(g *discovery.GPU, kind vocabulary.Kind, maxShares int) resourceapi.Device {
	attrs := gpuAttributes(g)
	attrs[vocabulary.AttrType] = kindAttr(kind)
	attrs[vocabulary.AttrUUID] = stringAttr(g.UUID)
	attrs[vocabulary.AttrMinor] = intAttr(g.Minor)

	memStep := int64(1 << 20) // 1Mi
	memDefault := (int64(g.MemoryBytes) / int64(maxShares)) / memStep * memStep
	capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		vocabulary.CapacityShares: {
			Value: *resource.NewQuantity(int64(maxShares), resource.DecimalSI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default:    resource.NewQuantity(1, resource.DecimalSI),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: resource.NewQuantity(1, resource.DecimalSI)},
			},
		},
		vocabulary.CapacityCompute: {
			Value: *resource.NewQuantity(100, resource.DecimalSI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: resource.NewQuantity(int64(100/maxShares), resource.DecimalSI),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  resource.NewQuantity(1, resource.DecimalSI),
					Step: resource.NewQuantity(1, resource.DecimalSI),
				},
			},
		},
		vocabulary.CapacityMemory: {
			Value: *resource.NewQuantity(int64(g.MemoryBytes), resource.BinarySI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: resource.NewQuantity(memDefault, resource.BinarySI),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  resource.NewQuantity(memStep, resource.BinarySI),
					Step: resource.NewQuantity(memStep, resource.BinarySI),
				},
			},
		},
	}
	return resourceapi.Device{
		Name:                     ShareDeviceName(g, kind),
		Attributes:               attrs,
		Capacity:                 capacity,
		AllowMultipleAllocations: ptr.To(true),
		ConsumesCounters:         consumeWhole(g),
	}
}

// ShareDeviceName names a GPU's share device: gpu-0-ts, gpu-0-mps.
func ShareDeviceName(g *discovery.GPU, kind vocabulary.Kind) string {
	suffix := map[vocabulary.Kind]string{vocabulary.KindTimeSlice: "ts", vocabulary.KindMPS: "mps"}[kind]
	return fmt.Sprintf("%s-%s", g.CanonicalName(), suffix)
}
