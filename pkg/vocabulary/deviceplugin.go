package vocabulary

import "strings"

// Extended resource names of NVIDIA's device plugin. The driver serves them
// through DRA extended resources (DeviceClasses with extendedResourceName),
// so pod specs written for the device plugin run unchanged, and refuses to
// publish on a node where a device plugin still advertises one of them
// (docs/migration.md).
const (
	// ResourceGPU is a whole GPU; with the device plugin's time-slicing
	// (not renamed) or its "single" MIG strategy also a share or a MIG
	// device.
	ResourceGPU = "nvidia.com/gpu"
	// ResourceGPUShared is a time-slicing share with renameByDefault.
	ResourceGPUShared = "nvidia.com/gpu.shared"
	// ResourceMIGPrefix starts the names of the "mixed" MIG strategy:
	// nvidia.com/mig-<profile>.
	ResourceMIGPrefix = "nvidia.com/mig-"
)

// MIGResourceName is the device plugin's name for a MIG profile,
// nvidia.com/mig-1g.10gb. Resource names allow no '+', so "1g.10gb+me"
// becomes nvidia.com/mig-1g.10gb.me, as the device plugin writes it.
func MIGResourceName(profile string) string {
	return ResourceMIGPrefix + strings.ReplaceAll(profile, "+", ".")
}

// IsDevicePluginResource says whether an extended resource name is one the
// NVIDIA device plugin advertises: nvidia.com/gpu, nvidia.com/gpu.<suffix>
// (renamed shares) or nvidia.com/mig-<profile>.
func IsDevicePluginResource(name string) bool {
	return name == ResourceGPU || strings.HasPrefix(name, ResourceGPU+".") || strings.HasPrefix(name, ResourceMIGPrefix)
}
