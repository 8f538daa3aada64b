package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Config is implemented by every kind of this API (GpuConfig and
// MigDeviceConfig), so callers can default and validate a decoded object
// without a type switch.
type Config interface {
	runtime.Object
	// Default fills in the defaults of unset fields. It never fails and may
	// be called more than once.
	Default()
	// Validate reports every invalid field, with paths rooted at the object
	// (for example sharing.mpsConfig.defaultActiveThreadPercentage).
	Validate() field.ErrorList
	// driverConfig keeps the interface to this package's kinds: another
	// API's types with Default and Validate (api/nvidia/v1beta1) are
	// converted, not taken for configs of this API.
	driverConfig()
}

func (*GpuConfig) driverConfig()       {}
func (*MigDeviceConfig) driverConfig() {}

var (
	_ Config = &GpuConfig{}
	_ Config = &MigDeviceConfig{}
)

// GpuConfig configures whole GPUs, and time-slicing or MPS shares of a GPU,
// allocated by the gpu.dra.dev driver.
//
// Example:
//
//	apiVersion: gpu.dra.dev/v1beta1
//	kind: GpuConfig
//	sharing:
//	  strategy: TimeSlicing
//	  timeSlicingConfig:
//	    interval: Long
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`

	// Sharing says how the GPU is shared between the containers and claims
	// it is prepared for. Unset means Exclusive.
	// +optional
	Sharing *GpuSharing `json:"sharing,omitempty"`
}

// MigDeviceConfig configures MIG devices allocated by the gpu.dra.dev
// driver.
//
// Example:
//
//	apiVersion: gpu.dra.dev/v1beta1
//	kind: MigDeviceConfig
//	sharing:
//	  strategy: MPS
//	  mpsConfig:
//	    defaultActiveThreadPercentage: 50
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type MigDeviceConfig struct {
	metav1.TypeMeta `json:",inline"`

	// Sharing says how the MIG device is shared between the containers and
	// claims it is prepared for. Unset means Exclusive.
	// +optional
	Sharing *MigDeviceSharing `json:"sharing,omitempty"`
}

// DefaultGpuConfig returns the GpuConfig that applies to a GPU when neither
// its DeviceClass nor its claim carries one: defaulted, with TypeMeta set.
func DefaultGpuConfig() *GpuConfig {
	c := &GpuConfig{TypeMeta: metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: GpuConfigKind}}
	c.Default()
	return c
}

// DefaultMigDeviceConfig returns the MigDeviceConfig that applies to a MIG
// device when neither its DeviceClass nor its claim carries one: defaulted,
// with TypeMeta set.
func DefaultMigDeviceConfig() *MigDeviceConfig {
	c := &MigDeviceConfig{TypeMeta: metav1.TypeMeta{APIVersion: GroupVersion.String(), Kind: MigDeviceConfigKind}}
	c.Default()
	return c
}
