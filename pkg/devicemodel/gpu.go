package devicemodel

import (
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
)

// gpuAttributes are the facts every device carved from a GPU (the whole GPU,
// its MIG devices, its shares) carries, so a claim can select by model,
// topology or versions whichever way it uses the GPU.
func gpuAttributes(g *discovery.GPU) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		AttrProductName:           stringAttr(g.ProductName),
		AttrBrand:                 stringAttr(g.Brand),
		AttrArchitecture:          stringAttr(g.Architecture),
		AttrCUDAComputeCapability: versionAttr(g.CUDAComputeCapability),
		AttrDriverVersion:         versionAttr(g.DriverVersion),
		AttrCUDADriverVersion:     versionAttr(g.CUDADriverVersion),
		AttrPCIBusID:              stringAttr(g.PCIBusID),
	}
	if g.PCIeRoot != "" {
		attrs[AttrPCIeRoot] = stringAttr(g.PCIeRoot)
	}
	if g.NUMANode >= 0 {
		attrs[AttrNUMANode] = intAttr(g.NUMANode)
	}
	if g.NVLinkDomain != "" {
		attrs[AttrNVLinkDomain] = stringAttr(g.NVLinkDomain)
	}
	return attrs
}

// WholeGPU is the device for exclusive use of a whole GPU.
func WholeGPU(g *discovery.GPU) resourceapi.Device {
	attrs := gpuAttributes(g)
	attrs[AttrType] = stringAttr(TypeGPU)
	attrs[AttrUUID] = stringAttr(g.UUID)
	attrs[AttrIndex] = intAttr(g.Index)
	attrs[AttrMinor] = intAttr(g.Minor)
	attrs[AttrMIGCapable] = boolAttr(g.MIGCapable)
	attrs[AttrMIGEnabled] = boolAttr(g.MIGEnabled)

	capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		CapacityMemory: bytesCapacity(g.MemoryBytes),
	}
	if g.Multiprocessors > 0 {
		capacity[CapacityMultiprocessors] = countCapacity(g.Multiprocessors)
	}
	return resourceapi.Device{
		Name:             g.CanonicalName(),
		Attributes:       attrs,
		Capacity:         capacity,
		ConsumesCounters: consumeAll(g),
	}
}
