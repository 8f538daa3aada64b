package simhooks

import (
	"context"
	"fmt"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

// TimeSlicer is a sharing.TimeSlicer over the simulated machine, for demos
// and tests. It addresses GPUs by DeviceRef.Index.
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
	if err := s.sim.SetTimeslice(gpu.Index, level); err != nil {
		return fmt.Errorf("set time-slice of %s: %w", gpu.UUID, err)
	}
	return nil
}

// Timeslice returns the simulated GPU's level.
func (s *TimeSlicer) Timeslice(_ context.Context, gpu sharing.DeviceRef) (int, error) {
	if gpu.IsMIG() {
		return 0, fmt.Errorf("time-slice of MIG device %s: %w", gpu.UUID, sharing.ErrNotSupported)
	}
	return s.sim.Timeslice(gpu.Index), nil
}
