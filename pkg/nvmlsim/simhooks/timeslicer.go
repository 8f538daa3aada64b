package simhooks

import (
	"context"
	"fmt"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

// TimeSlicer is a sharing.TimeSlicer over the simulated machine, for demos
// and tests. It addresses GPUs by DeviceRef.UUID, as nvidia-smi -i <UUID> does: an NVML index
// (DeviceRef.Index) is not the machine's index once a GPU is bound to vfio-pci and absent from
// NVML, since the GPUs after it close up.
type TimeSlicer struct {
	sim *nvmlsim.Machine
}

var _ sharing.TimeSlicer = (*TimeSlicer)(nil)

// NewTimeSlicer returns a TimeSlicer over a simulated machine.
func NewTimeSlicer(sim *nvmlsim.Machine) *TimeSlicer {
	return &TimeSlicer{sim: sim}
}

// SetTimeslice sets the simulated GPU's level; MIG devices are not
// supported, as on hardware.
func (s *TimeSlicer) SetTimeslice(_ context.Context, gpu sharing.DeviceRef, level int) error {
	if gpu.IsMIG() {
		return fmt.Errorf("set time-slice of MIG device %s: %w", gpu.UUID, sharing.ErrNotSupported)
	}
	index, err := s.machineIndex(gpu)
	if err != nil {
		return fmt.Errorf("set time-slice: %w", err)
	}
	if err := s.sim.SetTimeslice(index, level); err != nil {
		return fmt.Errorf("set time-slice of %s: %w", gpu.UUID, err)
	}
	return nil
}

// Timeslice returns the simulated GPU's level.
func (s *TimeSlicer) Timeslice(_ context.Context, gpu sharing.DeviceRef) (int, error) {
	if gpu.IsMIG() {
		return 0, fmt.Errorf("time-slice of MIG device %s: %w", gpu.UUID, sharing.ErrNotSupported)
	}
	index, err := s.machineIndex(gpu)
	if err != nil {
		return 0, fmt.Errorf("time-slice: %w", err)
	}
	return s.sim.Timeslice(index), nil
}

// machineIndex finds gpu on the simulated machine by its UUID.
func (s *TimeSlicer) machineIndex(gpu sharing.DeviceRef) (int, error) {
	index := s.sim.GPUIndex(gpu.UUID)
	if index < 0 {
		return 0, fmt.Errorf("no GPU with UUID %q on the simulated machine", gpu.UUID)
	}
	return index, nil
}
