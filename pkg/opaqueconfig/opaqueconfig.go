// Package opaqueconfig decodes the opaque configs this driver accepts, in
// claims and DeviceClasses, into its own API: configs of its own API
// (gpu.dra.dev/v1beta1, api/gpu/v1beta1) and those written for NVIDIA's DRA
// driver (resource.nvidia.com/v1beta1, api/nvidia/v1beta1), converted. The
// kubelet plugin, the admission webhook and kubectl gpu all call
// DecodeDefaultValidate, so a config the webhook admits is exactly one the
// plugin accepts, whichever API it was written in.
package opaqueconfig

import (
	"fmt"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	nvidiav1beta1 "github.com/gpu-dra/gpu-dra-driver/api/nvidia/v1beta1"
)

// apis are the APIs a config may be written in, this driver's first (its
// kinds are the ones an error without apiVersion suggests).
var apis = []*gpuv1beta1.API{gpuv1beta1.DriverAPI, nvidiav1beta1.API}

// DecodeDefaultValidate decodes one config with the bounded strict decoder
// (gpuv1beta1.DecodeObject), defaults and validates it in the API it was
// written in, and returns it as this driver's Config. Errors name the
// fields as the user wrote them; on a validation failure the error wraps an
// Aggregate of *field.Error and no config is returned.
func DecodeDefaultValidate(data []byte) (gpuv1beta1.Config, error) {
	obj, err := gpuv1beta1.DecodeObject(data, apis...)
	if err != nil {
		return nil, err
	}
	kind := obj.GetObjectKind().GroupVersionKind()
	switch cfg := obj.(type) {
	case nvidiav1beta1.Config:
		cfg.Default()
		if errs := cfg.Validate(); len(errs) > 0 {
			return nil, fmt.Errorf("invalid %s (%s): %w", kind.Kind, kind.GroupVersion(), errs.ToAggregate())
		}
		return cfg.DriverConfig(), nil
	case gpuv1beta1.Config:
		cfg.Default()
		if errs := cfg.Validate(); len(errs) > 0 {
			return nil, fmt.Errorf("invalid %s: %w", kind.Kind, errs.ToAggregate())
		}
		return cfg, nil
	default:
		return nil, fmt.Errorf("decode %s: decoded a %T, which is not a config", kind.Kind, obj)
	}
}
