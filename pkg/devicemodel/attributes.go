// Package devicemodel turns discovered GPUs into the DRA devices and
// ResourceSlices the scheduler allocates from: names, attributes, capacity
// and slice layout within the API's limits.
package devicemodel

import (
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"
)

// Attribute names, unqualified: the API puts them in the driver's domain
// (e.g. device.attributes['gpu.dra.dev'].productName in CEL).
const (
	AttrType                  resourceapi.QualifiedName = "type"
	AttrUUID                  resourceapi.QualifiedName = "uuid"
	AttrIndex                 resourceapi.QualifiedName = "index"
	AttrMinor                 resourceapi.QualifiedName = "minor"
	AttrProductName           resourceapi.QualifiedName = "productName"
	AttrBrand                 resourceapi.QualifiedName = "brand"
	AttrArchitecture          resourceapi.QualifiedName = "architecture"
	AttrCUDAComputeCapability resourceapi.QualifiedName = "cudaComputeCapability"
	AttrDriverVersion         resourceapi.QualifiedName = "driverVersion"
	AttrCUDADriverVersion     resourceapi.QualifiedName = "cudaDriverVersion"
	AttrMIGCapable            resourceapi.QualifiedName = "migCapable"
	AttrMIGEnabled            resourceapi.QualifiedName = "migEnabled"
	AttrNVLinkDomain          resourceapi.QualifiedName = "nvlinkDomain"
	AttrProfile               resourceapi.QualifiedName = "profile"
	AttrParentUUID            resourceapi.QualifiedName = "parentUUID"
	AttrParentMinor           resourceapi.QualifiedName = "parentMinor"
	AttrPlacementStart        resourceapi.QualifiedName = "placementStart"
	AttrStatic                resourceapi.QualifiedName = "static"

	// Standard attributes shared with other drivers on the same node.
	AttrPCIBusID = deviceattribute.StandardDeviceAttributePCIBusID
	AttrPCIeRoot = deviceattribute.StandardDeviceAttributePCIeRoot
	AttrNUMANode = deviceattribute.StandardDeviceAttributeNUMANode

	CapacityMemory          resourceapi.QualifiedName = "memory"
	CapacityMultiprocessors resourceapi.QualifiedName = "multiprocessors"
	CapacityCopyEngines     resourceapi.QualifiedName = "copyEngines"
	CapacityDecoders        resourceapi.QualifiedName = "decoders"
	CapacityEncoders        resourceapi.QualifiedName = "encoders"
	CapacityJPEGEngines     resourceapi.QualifiedName = "jpegEngines"
	CapacityOFAEngines      resourceapi.QualifiedName = "ofaEngines"
)

// Device types published in the AttrType attribute; DeviceClasses select on it.
const (
	TypeGPU         = "gpu"
	TypeMIG         = "mig"
	TypeTimeSlicing = "timeslice"
	TypeMPS         = "mps"
)

func stringAttr(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: ptr.To(s)}
}

func intAttr(i int) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(i))}
}

func boolAttr(b bool) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{BoolValue: ptr.To(b)}
}

// versionAttr publishes a dotted version as a semantic version so CEL can
// compare it (device.attributes[...].driverVersion.isGreaterThan(...)).
// NVIDIA versions are padded to three parts and lose leading zeros
// ("535.104.05" → "535.104.5"), which semver forbids; an unparsable version
// falls back to a string so nothing is silently dropped.
func versionAttr(v string) resourceapi.DeviceAttribute {
	parts := strings.Split(v, ".")
	if len(parts) == 0 || len(parts) > 3 {
		return stringAttr(v)
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return stringAttr(v)
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	return resourceapi.DeviceAttribute{VersionValue: ptr.To(strings.Join(parts, "."))}
}

func bytesCapacity(b uint64) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(b), resource.BinarySI)}
}

func countCapacity(n int) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(n), resource.DecimalSI)}
}
