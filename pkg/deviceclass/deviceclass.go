// Package deviceclass defines the DeviceClasses of the driver in one place:
// the YAML shipped under deployments/, the chart and the tests all come
// from here, so a selector cannot drift between them.
package deviceclass

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Class describes one DeviceClass: the kind of use it grants.
type Class struct {
	// Prefix is prepended to the driver name: "" gives "gpu.dra.dev".
	Prefix string
	// DeviceType is the kind of device (its type attribute) it selects.
	DeviceType  vocabulary.Kind
	Description string
	// NVIDIAName is the name of the class under vocabulary.NVIDIADriverName
	// where NVIDIA's driver names the class otherwise than Prefix would
	// (mig.nvidia.com, not mig.gpu.nvidia.com), so claims written for it
	// find the class. Empty: Prefix's name.
	NVIDIAName string
}

// Classes lists the driver's DeviceClasses.
var Classes = []Class{
	{Prefix: "", DeviceType: vocabulary.KindGPU, Description: "A whole GPU, exclusively."},
	{Prefix: "mig", DeviceType: vocabulary.KindMIG, Description: "A MIG device: a hardware partition of a GPU with its own memory and compute.", NVIDIAName: "mig.nvidia.com"},
	{Prefix: "timeslice", DeviceType: vocabulary.KindTimeSlice, Description: "A time-sliced share of a GPU; request capacity shares, compute (percent) and memory."},
	{Prefix: "mps", DeviceType: vocabulary.KindMPS, Description: "An MPS share of a GPU with enforced compute (percent) and memory limits."},
	{Prefix: "vfio", DeviceType: vocabulary.KindVFIO, Description: "A whole GPU bound to vfio-pci for a virtual machine (KubeVirt, Kata); published where the device policy enables passthrough."},
	IMEXChannel,
}

// IMEXChannel is the class of a compute domain's IMEX channel, which
// dra-controller requests in each ComputeDomain's shared channel claim
// (docs/compute-domains.md). NVIDIA's driver has no class of this name to
// keep: its channels belong to another driver (compute-domain.nvidia.com)
// and users never name the class, so under NVIDIA's driver name it is
// imex-channel.gpu.nvidia.com.
var IMEXChannel = Class{
	Prefix: "imex-channel", DeviceType: vocabulary.KindIMEXChannel,
	Description: "An IMEX channel of an NVLink clique, for a ComputeDomain's shared channel claim (created by dra-controller; pods reference the claim, not the class).",
}

// Name is the class's object name for a driver: <prefix>.<driver>, the
// driver name itself for the whole GPU, and NVIDIA's name under NVIDIA's
// driver name.
func (c Class) Name(driverName string) string {
	if driverName == vocabulary.NVIDIADriverName && c.NVIDIAName != "" {
		return c.NVIDIAName
	}
	if c.Prefix == "" {
		return driverName
	}
	return c.Prefix + "." + driverName
}

// Selector is the CEL expression selecting the class's devices.
func (c Class) Selector(driverName string) string {
	return fmt.Sprintf("device.driver == %q && device.attributes[%q].%s == %q",
		driverName, driverName, vocabulary.AttrType, c.DeviceType)
}

// DeviceClasses renders all classes for a driver name.
func DeviceClasses(driverName string) []*resourceapi.DeviceClass {
	out := make([]*resourceapi.DeviceClass, 0, len(Classes))
	for _, c := range Classes {
		out = append(out, &resourceapi.DeviceClass{
			TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
			ObjectMeta: metav1.ObjectMeta{
				Name:        c.Name(driverName),
				Annotations: map[string]string{vocabulary.AnnotationDescription: c.Description},
			},
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: c.Selector(driverName)}}},
			},
		})
	}
	return out
}
