package kubectlgpu

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// The plugin reads slices without importing the device model (which needs
// NVML); the names it relies on must still be the model's.
func TestNamesMatchTheDeviceModel(t *testing.T) {
	for ours, model := range map[string]resourceapi.QualifiedName{
		attrType: devicemodel.AttrType, attrUUID: devicemodel.AttrUUID, attrMinor: devicemodel.AttrMinor,
		attrProductName: devicemodel.AttrProductName, attrArchitecture: devicemodel.AttrArchitecture,
		attrCUDAComputeCapability: devicemodel.AttrCUDAComputeCapability, attrDriverVersion: devicemodel.AttrDriverVersion,
		attrCUDADriverVersion: devicemodel.AttrCUDADriverVersion, attrMIGCapable: devicemodel.AttrMIGCapable,
		attrMIGEnabled: devicemodel.AttrMIGEnabled, attrNVLinkDomain: devicemodel.AttrNVLinkDomain,
		attrProfile: devicemodel.AttrProfile, attrParentUUID: devicemodel.AttrParentUUID,
		attrParentMinor: devicemodel.AttrParentMinor, attrPlacementStart: devicemodel.AttrPlacementStart,
		attrStatic: devicemodel.AttrStatic, attrPCIBusID: devicemodel.AttrPCIBusID,
		attrPCIeRoot: devicemodel.AttrPCIeRoot, attrNUMANode: devicemodel.AttrNUMANode,
		capMemory: devicemodel.CapacityMemory, capShares: devicemodel.CapacityShares, capCompute: devicemodel.CapacityCompute,
	} {
		if ours != string(model) {
			t.Errorf("kubectl gpu reads %q, the device model publishes %q", ours, model)
		}
	}
	for ours, model := range map[string]string{
		TypeGPU: devicemodel.TypeGPU, TypeMIG: devicemodel.TypeMIG,
		TypeTimeSlicing: devicemodel.TypeTimeSlicing, TypeMPS: devicemodel.TypeMPS,
	} {
		if ours != model {
			t.Errorf("device type %q, the device model publishes %q", ours, model)
		}
	}
}
