package devicemodel

import (
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// VFIODevice is a whole GPU for a virtual machine: prepared, it leaves the
// host's nvidia driver for vfio-pci, so nothing else can use it. It
// consumes what the whole GPU consumes (consumeWhole): while it is
// allocated, the GPU cannot be allocated whole, as MIG devices or as
// shares, and the other way round.
func VFIODevice(g *discovery.GPU) resourceapi.Device {
	attrs := gpuAttributes(g)
	attrs[vocabulary.AttrType] = kindAttr(vocabulary.KindVFIO)
	attrs[vocabulary.AttrUUID] = stringAttr(g.UUID)
	attrs[vocabulary.AttrMinor] = intAttr(g.Minor)
	return resourceapi.Device{
		Name:       VFIODeviceName(g),
		Attributes: attrs,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			vocabulary.CapacityMemory: bytesCapacity(g.MemoryBytes),
		},
		ConsumesCounters: consumeWhole(g),
	}
}

// VFIODeviceName names a GPU's passthrough device: gpu-0-vfio.
func VFIODeviceName(g *discovery.GPU) string { return g.CanonicalName() + "-vfio" }
