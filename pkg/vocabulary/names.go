package vocabulary

import "fmt"

// DriverName is the DRA driver name: the ResourceSlices' driver, the
// whole-GPU DeviceClass, the domain of the attributes and capacities below,
// and the driver opaque configs are addressed to.
const DriverName = "gpu.dra.dev"

// NVIDIADriverName is the driver name of NVIDIA's DRA driver
// (k8s-dra-driver-gpu). Run under it (the chart's compat.nvidia profile),
// this driver publishes its devices with the attribute names NVIDIA's
// publishes (the names below are NVIDIA's where NVIDIA has one) in that
// domain, names its MIG DeviceClass as NVIDIA's (mig.nvidia.com), and
// accepts NVIDIA's opaque configs (api/nvidia/v1beta1), so claims written
// for NVIDIA's driver and NVIDIA's tools keyed on the name keep working.
const NVIDIADriverName = "gpu.nvidia.com"

// AnnotationDescription is the annotation of every DeviceClass the driver
// ships or generates: one line that says what the class hands out.
const AnnotationDescription = DriverName + "/description"

// Attribute names, unqualified: the API puts them in the driver's domain
// (device.attributes["gpu.dra.dev"].productName in CEL). Untyped, so that
// they key resourceapi.QualifiedName maps without this package importing
// the resource API.
const (
	AttrType                  = "type" // a Kind
	AttrUUID                  = "uuid"
	AttrIndex                 = "index"
	AttrMinor                 = "minor"
	AttrProductName           = "productName"
	AttrBrand                 = "brand"
	AttrArchitecture          = "architecture"
	AttrCUDAComputeCapability = "cudaComputeCapability"
	AttrDriverVersion         = "driverVersion"
	AttrCUDADriverVersion     = "cudaDriverVersion"
	AttrMIGCapable            = "migCapable"
	AttrMIGEnabled            = "migEnabled"
	AttrNVLinkDomain          = "nvlinkDomain"
	// AttrCliqueID and AttrClusterUUID are the NVLink fabric's clique
	// ("<cluster UUID>.<clique ID>") and cluster UUID, published only where
	// NVML reports a completed fabric: a claim whose requests match on
	// cliqueID lands on GPUs of one NVLink partition, across nodes of a
	// multi-node NVLink rack (docs/compute-domains.md).
	AttrCliqueID       = "cliqueID"
	AttrClusterUUID    = "clusterUUID"
	AttrProfile        = "profile"
	AttrParentUUID     = "parentUUID"
	AttrParentMinor    = "parentMinor"
	AttrPlacementStart = "placementStart"
	AttrStatic         = "static"
	// AttrVFIODevice is in a passthrough device's metadata only (not
	// published): its IOMMU group's VFIO device, /dev/vfio/<group>, which
	// a VM launcher opens.
	AttrVFIODevice = "vfioDevice"

	// Standard attributes shared with other drivers on the same node
	// (k8s.io/dynamic-resource-allocation/deviceattribute; a test checks
	// they are its names).
	AttrPCIBusID = "resource.kubernetes.io/pciBusID"
	AttrPCIeRoot = "resource.kubernetes.io/pcieRoot"
	AttrNUMANode = "resource.kubernetes.io/numaNode"
)

// Capacity names, unqualified like the attributes.
const (
	CapacityMemory          = "memory"
	CapacityMultiprocessors = "multiprocessors"
	CapacityCopyEngines     = "copyEngines"
	CapacityDecoders        = "decoders"
	CapacityEncoders        = "encoders"
	CapacityJPEGEngines     = "jpegEngines"
	CapacityOFAEngines      = "ofaEngines"

	// CapacityShares counts the claims sharing a GPU (the device plugin's
	// "replicas"); a share takes 1 unless it asks for more.
	CapacityShares = "shares"
	// CapacityCompute is a share's part of the GPU's compute, in percent.
	CapacityCompute = "compute"
)

// Counter names in a GPU's counter set. Besides these, one counter per MIG
// memory slice (MemorySliceCounter) encodes MIG placement.
const (
	CounterComputeSlices = "compute-slices"
	CounterDecoders      = "decoders"
	CounterEncoders      = "encoders"
	CounterJPEGEngines   = "jpeg-engines"
	CounterOFAEngines    = "ofa-engines"
)

// MemorySliceCounter names the counter of memory slice i of a GPU.
func MemorySliceCounter(i int) string { return fmt.Sprintf("memory-slice-%d", i) }

// KubeletPluginAgent is the user agent prefix of the kubelet plugin's API
// client, and so the field manager the API server records in the
// managedFields of every ResourceSlice the plugin writes (it takes the user
// agent up to its first '/' when a request names no field manager). The
// coexistence guard tells the plugin's slices from those of NVIDIA's DRA
// driver by it when both publish under NVIDIADriverName.
const KubeletPluginAgent = "dra-kubelet-plugin"

// ControllerAgent is the user agent of dra-controller's API clients, and so
// the field manager the API server records for what the controller writes
// without naming one, e.g. its IMEX channel slices (the upstream slice
// controller names none). pkg/controller/imexchannels tells the channel
// slices it published under the other driver name by it, and the chart's
// -controller-resourceslices policy admits deleting only those.
const ControllerAgent = "gpu-dra-controller"
