// Package v1beta1 is the opaque parameter API of the gpu.dra.dev DRA driver.
//
// Its objects travel in DeviceClass.spec.config[].opaque.parameters and
// ResourceClaim.spec.devices.config[].opaque.parameters for driver
// gpu.dra.dev:
//
//   - GpuConfig configures whole GPUs and time-slicing or MPS shares of a GPU.
//   - MigDeviceConfig configures MIG devices.
//
// The package holds only the API: types, the scheme, a strict decoder,
// defaulting and validation. The decoder (DecodeObject) also reads other
// APIs given to it with the same bounds: NVIDIA's (api/nvidia/v1beta1). The
// kubelet plugin and the admission webhook both call
// pkg/opaqueconfig.DecodeDefaultValidate, which decodes either API into this
// one, so a config the webhook admits is exactly a config the plugin
// accepts. Which of several configs applies to a device
// is decided by the plugin, not by this package.
//
// +k8s:deepcopy-gen=package
// +groupName=gpu.dra.dev
package v1beta1

//go:generate go run k8s.io/code-generator/cmd/deepcopy-gen@v0.37.2 --output-file zz_generated.deepcopy.go --go-header-file /dev/null .
