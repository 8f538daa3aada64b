package mig

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Errors that callers can test with errors.Is. The NVML return code, where there is one, is
// wrapped as well (errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES) works).
var (
	// ErrNotCapable: the GPU does not support MIG.
	ErrNotCapable = errors.New("GPU is not MIG capable")
	// ErrUnknownProfile: the GPU has no GPU-instance profile with the requested ID.
	ErrUnknownProfile = errors.New("unknown MIG profile")
	// ErrInvalidPlacement: the placement is not one the profile can take.
	ErrInvalidPlacement = errors.New("invalid MIG placement")
	// ErrPlacementInUse: the placement overlaps another GPU instance, or an instance with that
	// profile and placement exists with compute instances this package did not create.
	ErrPlacementInUse = errors.New("MIG placement in use")
	// ErrGPUInUse: MIG mode cannot change because the GPU has processes or GPU instances.
	ErrGPUInUse = errors.New("GPU in use")
	// ErrResetRequired: a MIG mode change waits for a GPU reset (A100/A30, pass-through VMs).
	ErrResetRequired = errors.New("GPU reset required to change MIG mode")
)

// gone reports whether ret says that an instance does not exist (any more): NVML answers
// NOT_FOUND for an unknown ID, INVALID_ARGUMENT for an ID out of range or a stale handle, and
// NOT_SUPPORTED for instance lookups while MIG mode is off (then no instance exists).
func gone(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_NOT_SUPPORTED
}

// unsupported reports whether ret says that a profile index is not supported by the GPU.
func unsupported(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT
}

// gpuUUID returns dev's UUID, which every error message names.
func gpuUUID(dev nvml.Device) (string, error) {
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("get GPU UUID: %w", ret)
	}
	return uuid, nil
}
