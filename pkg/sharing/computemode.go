package sharing

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ComputeModes reads and sets the compute mode of a GPU. Errors for a
// device or driver that does not support it wrap ErrNotSupported.
type ComputeModes interface {
	ComputeMode(ctx context.Context, uuid string) (nvml.ComputeMode, error)
	SetComputeMode(ctx context.Context, uuid string, mode nvml.ComputeMode) error
}

// NVMLComputeModes implements ComputeModes over NVML (the real library or
// pkg/nvmlsim). NVML must be initialized.
type NVMLComputeModes struct {
	lib nvml.Interface
}

var _ ComputeModes = (*NVMLComputeModes)(nil)

// NewNVMLComputeModes returns ComputeModes over an initialized NVML.
func NewNVMLComputeModes(lib nvml.Interface) *NVMLComputeModes {
	return &NVMLComputeModes{lib: lib}
}

// ComputeMode returns the compute mode of the GPU with the given UUID.
func (c *NVMLComputeModes) ComputeMode(_ context.Context, uuid string) (nvml.ComputeMode, error) {
	dev, ret := c.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("get handle of %s: %w", uuid, nvmlError(ret))
	}
	mode, ret := dev.GetComputeMode()
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("get compute mode of %s: %w", uuid, nvmlError(ret))
	}
	return mode, nil
}

// SetComputeMode sets the compute mode of the GPU with the given UUID.
func (c *NVMLComputeModes) SetComputeMode(_ context.Context, uuid string, mode nvml.ComputeMode) error {
	dev, ret := c.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("get handle of %s: %w", uuid, nvmlError(ret))
	}
	if ret := dev.SetComputeMode(mode); ret != nvml.SUCCESS {
		return fmt.Errorf("set compute mode of %s to %s: %w", uuid, computeModeName(mode), nvmlError(ret))
	}
	return nil
}

// nvmlError turns an NVML return code into an error that wraps
// ErrNotSupported for ERROR_NOT_SUPPORTED.
func nvmlError(ret nvml.Return) error {
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return fmt.Errorf("%w (%w)", ErrNotSupported, ret)
	}
	return ret
}

// computeModeName names a compute mode as nvidia-smi -c does.
func computeModeName(mode nvml.ComputeMode) string {
	switch mode {
	case nvml.COMPUTEMODE_DEFAULT:
		return "DEFAULT"
	case nvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return "EXCLUSIVE_THREAD"
	case nvml.COMPUTEMODE_PROHIBITED:
		return "PROHIBITED"
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return "EXCLUSIVE_PROCESS"
	default:
		return fmt.Sprintf("compute mode %d", int(mode))
	}
}
