// Package v1beta1 is the opaque parameter API of NVIDIA's DRA driver
// (k8s-dra-driver-gpu), resource.nvidia.com/v1beta1, as this driver accepts
// it: GpuConfig and MigDeviceConfig with sharing.strategy TimeSlicing or
// MPS. Claims written for NVIDIA's driver keep their configs when they move
// here (docs/migration.md, "From NVIDIA's DRA driver").
//
// The types are NVIDIA's, field for field, so the strict decoder rejects
// what NVIDIA's driver would not read (clientPriority, strategy Exclusive).
// They are decoded by the bounded strict decoder of api/gpu/v1beta1
// (DecodeObject with API), defaulted, validated with the same field paths
// as this driver's own configs, and converted into them (DriverConfig):
// the kubelet plugin prepares, and the webhook admits, only the converted
// config. Where this driver cannot do what NVIDIA's would, Validate
// refuses with the reason rather than approximate. The other kinds of the
// group (VfioDeviceConfig, the ComputeDomain configs) are refused by name.
//
// +k8s:deepcopy-gen=package
// +groupName=resource.nvidia.com
package v1beta1

//go:generate go run k8s.io/code-generator/cmd/deepcopy-gen@v0.35.3 --output-file zz_generated.deepcopy.go --go-header-file /dev/null .
