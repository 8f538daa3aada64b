package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const (
	// GroupName is the API group of the opaque parameters. Configs of this
	// API are addressed to the driver vocabulary.DriverName (pkg/vocabulary),
	// which is the same name.
	GroupName = "gpu.dra.dev"
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

// addKnownTypes registers GpuConfig, MigDeviceConfig, ComputeDomainChannelConfig and ComputeDomain (with its list) under
// GroupVersion.
func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion,
		&GpuConfig{},
		&MigDeviceConfig{},
		&ComputeDomainChannelConfig{},
		&ComputeDomain{},
		&ComputeDomainList{},
	)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}

// kinds lists the kinds Decode accepts. AddToGroupVersion also registers
// meta kinds such as WatchEvent and ListOptions under GroupVersion, and
// ComputeDomain is an API object; they are not opaque configs, so Decode
// checks against this list, not the scheme.
var kinds = []string{GpuConfigKind, MigDeviceConfigKind, ComputeDomainChannelConfigKind}
