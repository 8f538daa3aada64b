package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

const (
	// GroupName is the API group of NVIDIA's opaque parameters.
	GroupName = "resource.nvidia.com"
	// Version is the API version of the types in this package.
	Version = "v1beta1"

	// GpuConfigKind is the kind of GpuConfig.
	GpuConfigKind = "GpuConfig"
	// MigDeviceConfigKind is the kind of MigDeviceConfig.
	MigDeviceConfigKind = "MigDeviceConfig"
)

// GroupVersion is the group and version of the types in this package.
var GroupVersion = schema.GroupVersion{Group: GroupName, Version: Version}

var (
	// SchemeBuilder registers the types of this package with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &GpuConfig{}, &MigDeviceConfig{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}

// refusedKinds are the other configs of NVIDIA's group: this driver has
// nothing they could configure, so they are refused by name rather than
// reported as unknown.
var refusedKinds = map[string]string{
	"VfioDeviceConfig":           "this driver does not pass GPUs through to virtual machines (VFIO)",
	"ComputeDomainChannelConfig": "this driver has no ComputeDomains (multi-node NVLink/IMEX)",
	"ComputeDomainDaemonConfig":  "this driver has no ComputeDomains (multi-node NVLink/IMEX)",
}

// API is NVIDIA's API for gpuv1beta1.DecodeObject.
var API = gpuv1beta1.NewAPI(GroupVersion, AddToScheme, []string{GpuConfigKind, MigDeviceConfigKind}, refusedKinds)
