package v1beta1

// Default sets unset fields of the GpuConfig to their defaults: no sharing
// means Exclusive, and the sub-config of the chosen strategy is filled in
// (see GpuSharing.Default). It leaves invalid values for Validate to report.
func (c *GpuConfig) Default() {
	if c == nil {
		return
	}
	if c.Sharing == nil {
		c.Sharing = &GpuSharing{Strategy: ExclusiveStrategy}
	}
	c.Sharing.Default()
}

// Default sets unset fields of the MigDeviceConfig to their defaults: no
// sharing means Exclusive, and MPS gets an MPSConfig (see
// MigDeviceSharing.Default).
func (c *MigDeviceConfig) Default() {
	if c == nil {
		return
	}
	if c.Sharing == nil {
		c.Sharing = &MigDeviceSharing{Strategy: ExclusiveStrategy}
	}
	c.Sharing.Default()
}

// Default fills in the sub-config of the chosen strategy: TimeSlicing gets a
// TimeSlicingConfig with interval Default, MPS gets an MPSConfig. A missing
// strategy is not guessed (Validate reports it), and a sub-config of another
// strategy is left alone for Validate to reject.
func (s *GpuSharing) Default() {
	if s == nil {
		return
	}
	switch s.Strategy {
	case TimeSlicingStrategy:
		if s.TimeSlicingConfig == nil {
			s.TimeSlicingConfig = &TimeSlicingConfig{}
		}
		s.TimeSlicingConfig.Default()
	case MPSStrategy:
		if s.MPSConfig == nil {
			s.MPSConfig = &MPSConfig{}
		}
		s.MPSConfig.Default()
	}
}

// Default fills in the MPSConfig when the strategy is MPS. TimeSlicing has
// nothing to fill in on a MIG device.
func (s *MigDeviceSharing) Default() {
	if s == nil {
		return
	}
	if s.Strategy == MPSStrategy {
		if s.MPSConfig == nil {
			s.MPSConfig = &MPSConfig{}
		}
		s.MPSConfig.Default()
	}
}

// Default sets an unset interval to Default.
func (c *TimeSlicingConfig) Default() {
	if c == nil {
		return
	}
	if c.Interval == nil {
		interval := DefaultTimeSlice
		c.Interval = &interval
	}
}

// Default sets an unset client priority to Normal. The thread percentage and
// memory limits stay unset: the plugin derives them from the claim's
// capacity request.
func (c *MPSConfig) Default() {
	if c == nil {
		return
	}
	if c.ClientPriority == nil {
		priority := NormalMPSClientPriority
		c.ClientPriority = &priority
	}
}
