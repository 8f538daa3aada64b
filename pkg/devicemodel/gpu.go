package devicemodel

import (
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// gpuAttributes are the facts every device carved from a GPU (the whole GPU,
// its MIG devices, its shares) carries, so a claim can select by model,
// topology or versions whichever way it uses the GPU.
func gpuAttributes(g *discovery.GPU) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		vocabulary.AttrProductName:           stringAttr(g.ProductName),
		vocabulary.AttrBrand:                 stringAttr(g.Brand),
		vocabulary.AttrArchitecture:          stringAttr(g.Architecture),
		vocabulary.AttrCUDAComputeCapability: versionAttr(g.CUDAComputeCapability),
		vocabulary.AttrDriverVersion:         versionAttr(g.DriverVersion),
		vocabulary.AttrCUDADriverVersion:     versionAttr(g.CUDADriverVersion),
		vocabulary.AttrPCIBusID:              stringAttr(g.PCIBusID),
	}
	if g.PCIeRoot != "" {
		attrs[vocabulary.AttrPCIeRoot] = stringAttr(g.PCIeRoot)
	}
	if g.NUMANode >= 0 {
		attrs[vocabulary.AttrNUMANode] = intAttr(g.NUMANode)
	}
	if g.NVLinkDomain != "" {
		attrs[vocabulary.AttrNVLinkDomain] = stringAttr(g.NVLinkDomain)
	}
	if g.CliqueID != "" {
		attrs[vocabulary.AttrCliqueID] = stringAttr(g.CliqueID)
		attrs[vocabulary.AttrClusterUUID] = stringAttr(g.ClusterUUID)
	}
	return attrs
}

// WholeGPU is the device for exclusive use of a whole GPU.
func WholeGPU(g *discovery.GPU) resourceapi.Device {
	attrs := gpuAttributes(g)
	attrs[vocabulary.AttrType] = kindAttr(vocabulary.KindGPU)
	attrs[vocabulary.AttrUUID] = stringAttr(g.UUID)
	attrs[vocabulary.AttrIndex] = intAttr(g.Index)
	attrs[vocabulary.AttrMinor] = intAttr(g.Minor)
	attrs[vocabulary.AttrMIGCapable] = boolAttr(g.MIGCapable)
	attrs[vocabulary.AttrMIGEnabled] = boolAttr(g.MIGEnabled)

	capacity := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		vocabulary.CapacityMemory: bytesCapacity(g.MemoryBytes),
	}
	if g.Multiprocessors > 0 {
		capacity[vocabulary.CapacityMultiprocessors] = countCapacity(g.Multiprocessors)
	}
	return resourceapi.Device{
		Name:             g.CanonicalName(),
		Attributes:       attrs,
		Capacity:         capacity,
		ConsumesCounters: consumeWhole(g),
	}
}
