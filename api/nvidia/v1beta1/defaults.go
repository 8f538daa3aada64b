package v1beta1

import gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"

// Default fills in the sub-config of the chosen strategy, as NVIDIA's
// driver does: TimeSlicing gets interval Default, MPS an empty mpsConfig.
// No sharing stays no sharing, which this driver prepares as exclusive use
// (NVIDIA's default, TimeSlicing at interval Default for the containers of
// the one claim, is what exclusive use is: see DriverConfig).
func (c *GpuConfig) Default() {
	if c == nil || c.Sharing == nil {
		return
	}
	switch c.Sharing.Strategy {
	case TimeSlicingStrategy:
		if c.Sharing.TimeSlicingConfig == nil {
			c.Sharing.TimeSlicingConfig = &gpuv1beta1.TimeSlicingConfig{}
		}
		c.Sharing.TimeSlicingConfig.Default()
	case MPSStrategy:
		if c.Sharing.MpsConfig == nil {
			c.Sharing.MpsConfig = &MpsConfig{}
		}
	}
}

// Default gives MPS an empty mpsConfig; TimeSlicing of a MIG device has
// nothing to fill in.
func (c *MigDeviceConfig) Default() {
	if c == nil || c.Sharing == nil {
		return
	}
	if c.Sharing.Strategy == MPSStrategy && c.Sharing.MpsConfig == nil {
		c.Sharing.MpsConfig = &MpsConfig{}
	}
}
