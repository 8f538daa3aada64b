package nvmlsim

import (
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// GPU Performance Monitoring (GPM, Hopper and later): a sample holds the SM time the simulated
// processes accumulated on a GPU or a GPU instance until it was taken; GpmMetricsGet turns two
// samples into the SM utilization between them.

// gpmSample is an nvml.GpmSample of the simulation.
type gpmSample struct {
	m *Machine
	// source is the GPU's UUID and, for a GPU-instance sample, the instance's ID + 1.
	source    string
	gi        uint32
	taken     time.Time
	smSeconds float64
}

func (s *gpmSample) Free() nvml.Return                        { return nvml.SUCCESS }
func (s *gpmSample) Get(d nvml.Device) nvml.Return            { return d.GpmSampleGet(s) }
func (s *gpmSample) MigGet(d nvml.Device, gi int) nvml.Return { return d.GpmMigSampleGet(gi, s) }

// setGpmFuncs sets the GPM functions of the Interface.
func (m *Machine) setGpmFuncs(iface *mock.Interface) {
	iface.GpmSampleAllocFunc = func() (nvml.GpmSample, nvml.Return) { return &gpmSample{m: m}, m.initialized() }
	iface.GpmSampleFreeFunc = func(s nvml.GpmSample) nvml.Return { return s.Free() }
	// The device-taking functions answer for the device as its own methods do, in one call.
	iface.GpmSampleGetFunc = func(d nvml.Device, s nvml.GpmSample) nvml.Return {
		return m.onGPU(d, func(g *gpu) nvml.Return { return g.gpmSample(s, nil) })
	}
	iface.GpmMigSampleGetFunc = func(d nvml.Device, gi int, s nvml.GpmSample) nvml.Return {
		id := uint32(gi)
		return m.onGPU(d, func(g *gpu) nvml.Return { return g.gpmSample(s, &id) })
	}
	iface.GpmQueryDeviceSupportFunc = func(d nvml.Device) (support nvml.GpmSupport, ret nvml.Return) {
		ret = m.onGPU(d, func(g *gpu) nvml.Return { support = g.gpmSupport(); return nvml.SUCCESS })
		return support, ret
	}
	iface.GpmMetricsGetFunc = m.gpmMetricsGet
}

// onGPU runs f for the GPU whose handle d is; a MIG device or unknown handle is an invalid
// argument, as GPM sampling takes the GPU's handle.
func (m *Machine) onGPU(d nvml.Device, f func(*gpu) nvml.Return) nvml.Return {
	for _, g := range m.gpus {
		if nvml.Device(g.handle) == d {
			if ret, fail := m.checkDevice(g.index, "Gpm"); fail { // counted by the Interface's guard
				return ret
			}
			return f(g)
		}
	}
	return nvml.ERROR_INVALID_ARGUMENT
}

func (g *gpu) gpmSupport() nvml.GpmSupport {
	supported := uint32(0)
	if g.spec.arch >= nvml.DEVICE_ARCH_HOPPER {
		supported = 1
	}
	return nvml.GpmSupport{Version: nvml.GPM_SUPPORT_VERSION, IsSupportedDevice: supported}
}

// gpmSample fills s with the SM time of g (gi nil) or of its GPU instance *gi.
func (g *gpu) gpmSample(s nvml.GpmSample, gi *uint32) nvml.Return {
	sample, ok := s.(*gpmSample)
	if !ok || sample.m != g.m {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if g.spec.arch < nvml.DEVICE_ARCH_HOPPER {
		return nvml.ERROR_NOT_SUPPORTED
	}
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	var uuids []string
	switch {
	case gi == nil && !g.migEnabled():
		uuids = []string{g.uuid}
	case gi == nil:
		for _, ci := range g.computeInstances() {
			uuids = append(uuids, ci.uuid)
		}
	default:
		inst := g.gpuInstances[*gi]
		if !g.migEnabled() || inst == nil {
			return nvml.ERROR_NOT_FOUND
		}
		for _, ci := range inst.sortedComputeInstances() {
			uuids = append(uuids, ci.uuid)
		}
	}
	now := time.Now()
	total := 0.0
	for _, uuid := range uuids {
		total += g.m.smSecondsEnded[uuid]
		for _, p := range g.m.onDeviceLocked(uuid) {
			total += p.smSeconds(now)
		}
	}
	*sample = gpmSample{m: g.m, source: g.uuid, taken: now, smSeconds: total}
	if gi != nil {
		sample.gi = *gi + 1
	}
	return nvml.SUCCESS
}

// gpmMetricsGet computes the metrics between two samples of the same GPU or GPU instance: SM and
// graphics utilization (percent); other metrics are not supported.
func (m *Machine) gpmMetricsGet(mg *nvml.GpmMetricsGetType) nvml.Return {
	if ret := m.initialized(); ret != nvml.SUCCESS {
		return ret
	}
	if mg == nil || mg.Version != nvml.GPM_METRICS_GET_VERSION || int(mg.NumMetrics) > len(mg.Metrics) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	s1, ok1 := mg.Sample1.(*gpmSample)
	s2, ok2 := mg.Sample2.(*gpmSample)
	if !ok1 || !ok2 || s1.m != m || s2.m != m || s1.source == "" || s1.source != s2.source || s1.gi != s2.gi || !s2.taken.After(s1.taken) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	util := min((s2.smSeconds-s1.smSeconds)/s2.taken.Sub(s1.taken).Seconds(), 100)
	for i := range mg.Metrics[:mg.NumMetrics] {
		metric := &mg.Metrics[i]
		switch nvml.GpmMetricId(metric.MetricId) {
		case nvml.GPM_METRIC_SM_UTIL, nvml.GPM_METRIC_GRAPHICS_UTIL:
			metric.Value, metric.NvmlReturn = util, uint32(nvml.SUCCESS)
		default:
			metric.Value, metric.NvmlReturn = 0, uint32(nvml.ERROR_NOT_SUPPORTED)
		}
	}
	return nvml.SUCCESS
}
