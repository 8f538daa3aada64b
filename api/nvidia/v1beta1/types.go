package v1beta1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// Config is implemented by GpuConfig and MigDeviceConfig.
type Config interface {
	runtime.Object
	// Default fills in the defaults of unset fields.
	Default()
	// Validate reports every invalid field, with paths rooted at the
	// object, as this driver's own configs do.
	Validate() field.ErrorList
	// DriverConfig is the config as this driver's own API, which the
	// plugin applies. Call it on a defaulted, valid config.
	DriverConfig() gpuv1beta1.Config
}

var (
	_ Config = &GpuConfig{}
	_ Config = &MigDeviceConfig{}
)

// SharingStrategy is TimeSlicing or MPS. NVIDIA's API has no Exclusive:
// leaving sharing out is its exclusive use.
type SharingStrategy string

// The strategies of NVIDIA's API.
const (
	TimeSlicingStrategy SharingStrategy = "TimeSlicing"
	MPSStrategy         SharingStrategy = "MPS"
)

var strategies = []SharingStrategy{TimeSlicingStrategy, MPSStrategy}

// GpuConfig configures a GPU allocated under NVIDIA's driver name.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	Sharing *GpuSharing `json:"sharing,omitempty"`
}

// MigDeviceConfig configures a MIG device.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type MigDeviceConfig struct {
	metav1.TypeMeta `json:",inline"`
	// +optional
	Sharing *MigDeviceSharing `json:"sharing,omitempty"`
}

// GpuSharing is NVIDIA's sharing of a GPU.
type GpuSharing struct {
	Strategy SharingStrategy `json:"strategy"`
	// +optional
	TimeSlicingConfig *gpuv1beta1.TimeSlicingConfig `json:"timeSlicingConfig,omitempty"`
	// +optional
	MpsConfig *MpsConfig `json:"mpsConfig,omitempty"`
}

// MigDeviceSharing is NVIDIA's sharing of a MIG device: no
// timeSlicingConfig, as in this driver's API.
type MigDeviceSharing struct {
	Strategy SharingStrategy `json:"strategy"`
	// +optional
	MpsConfig *MpsConfig `json:"mpsConfig,omitempty"`
}

// MpsConfig is NVIDIA's MPS configuration: this driver's MPSConfig without
// clientPriority. The fields mean what they mean there (api/gpu/v1beta1).
type MpsConfig struct {
	// +optional
	DefaultActiveThreadPercentage *int `json:"defaultActiveThreadPercentage,omitempty"`
	// +optional
	DefaultPinnedDeviceMemoryLimit *resource.Quantity `json:"defaultPinnedDeviceMemoryLimit,omitempty"`
	// +optional
	DefaultPerDevicePinnedMemoryLimit map[string]resource.Quantity `json:"defaultPerDevicePinnedMemoryLimit,omitempty"`
}
