package nvmlsim

import (
	"math"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// Telemetry of an idle GPU: values drift slowly (periods of minutes) and differ per GPU, so
// polling code sees change without noise. Utilization and used memory follow the simulated
// processes (processes.go) while there are any.

// wave returns a value in [-1, 1] with the given period, phase-shifted by GPU index.
func (g *gpu) wave(period time.Duration) float64 {
	t := float64(time.Now().UnixNano()) / float64(period)
	return math.Sin(2*math.Pi*t + float64(g.index)*0.9)
}

func (g *gpu) temperatureC() uint32 {
	return uint32(31 + g.index%3 + int(math.Round(3*g.wave(11*time.Minute))))
}

func (g *gpu) powerMilliwatts() uint32 {
	s := g.spec
	return s.idlePowerW*1000 + uint32((1+g.wave(7*time.Minute))*float64(s.powerLimitW)*8) // up to +1.6% of the limit
}

// usedMemory is the memory the processes on g and its MIG devices hold.
func (g *gpu) usedMemory() (mem uint64) {
	g.locked(func() { _, mem = usage(g.processesLocked()) })
	return mem
}

func (g *gpu) utilizationPercent() uint32 {
	return uint32(math.Round(2 * (1 + g.wave(5*time.Minute)))) // 0-4%
}

// clockMHz is the current clock of type t: idle clocks are a fraction of the maximum.
func (g *gpu) clockMHz(t nvml.ClockType) (uint32, nvml.Return) {
	switch t {
	case nvml.CLOCK_GRAPHICS, nvml.CLOCK_SM:
		return g.spec.maxSMClockMHz * 3 / 4, nvml.SUCCESS
	case nvml.CLOCK_MEM:
		return g.spec.maxMemClockMHz, nvml.SUCCESS
	case nvml.CLOCK_VIDEO:
		return g.spec.maxSMClockMHz * 2 / 3, nvml.SUCCESS
	}
	return 0, nvml.ERROR_INVALID_ARGUMENT
}

func (g *gpu) maxClockMHz(t nvml.ClockType) (uint32, nvml.Return) {
	switch t {
	case nvml.CLOCK_GRAPHICS, nvml.CLOCK_SM:
		return g.spec.maxSMClockMHz, nvml.SUCCESS
	case nvml.CLOCK_MEM:
		return g.spec.maxMemClockMHz, nvml.SUCCESS
	case nvml.CLOCK_VIDEO:
		return g.spec.maxSMClockMHz * 9 / 10, nvml.SUCCESS
	}
	return 0, nvml.ERROR_INVALID_ARGUMENT
}

func (g *gpu) setTelemetryFuncs(d *mock.Device) {
	s := g.spec
	start := time.Now()
	d.GetTemperatureFunc = func(sensor nvml.TemperatureSensors) (uint32, nvml.Return) {
		if sensor != nvml.TEMPERATURE_GPU {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		return g.temperatureC(), nvml.SUCCESS
	}
	d.GetTemperatureThresholdFunc = func(t nvml.TemperatureThresholds) (uint32, nvml.Return) {
		switch t {
		case nvml.TEMPERATURE_THRESHOLD_SHUTDOWN:
			return 92, nvml.SUCCESS
		case nvml.TEMPERATURE_THRESHOLD_SLOWDOWN:
			return 89, nvml.SUCCESS
		}
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return g.powerMilliwatts(), nvml.SUCCESS }
	d.GetPowerManagementLimitFunc = func() (uint32, nvml.Return) { return s.powerLimitW * 1000, nvml.SUCCESS }
	d.GetPowerManagementDefaultLimitFunc = d.GetPowerManagementLimitFunc
	d.GetEnforcedPowerLimitFunc = d.GetPowerManagementLimitFunc
	d.GetTotalEnergyConsumptionFunc = func() (uint64, nvml.Return) {
		// millijoules since the machine was created, at idle power
		return uint64(time.Since(start).Seconds() * float64(s.idlePowerW) * 1000), nvml.SUCCESS
	}
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		var migEnabled bool
		g.locked(func() { migEnabled = g.migCurrent == nvml.DEVICE_MIG_ENABLE })
		if migEnabled {
			// NVML does not attribute utilization on MIG-enabled GPUs.
			return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED
		}
		u := g.utilizationPercent()
		g.locked(func() {
			if procs := g.processesLocked(); len(procs) > 0 {
				u, _ = usage(procs) // a kernel of any process keeps the GPU busy
			}
		})
		return nvml.Utilization{Gpu: u, Memory: u / 2}, nvml.SUCCESS
	}
	d.GetClockInfoFunc = g.clockMHz
	d.GetMaxClockInfoFunc = g.maxClockMHz
	d.GetPerformanceStateFunc = func() (nvml.Pstates, nvml.Return) { return nvml.PSTATE_0, nvml.SUCCESS }
	d.GetPowerStateFunc = d.GetPerformanceStateFunc
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return 0, nvml.SUCCESS }
}
