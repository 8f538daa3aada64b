package telemetry

import (
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/component-base/metrics"

	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry/dcgm"
)

// XIDSource gives the last XID error NVML reported for a GPU;
// DriverMetrics implements it from the health events it counts.
type XIDSource interface {
	// LastXID returns the GPU's last XID since the plugin started; false
	// when there was none.
	LastXID(uuid string) (uint64, bool)
}

const mib = 1 << 20

// dcgmExposition describes the dcgm-exporter-compatible series and keeps
// what their rates need between scrapes. Its state is guarded by the
// collector's procs.mu, which a scrape holds throughout.
type dcgmExposition struct {
	descs map[string]*metrics.Desc
	types map[string]metrics.ValueType
	// nvlink is the previous NVLink byte counter of each GPU and direction.
	nvlink map[string]counterAt
	now    func() time.Time
}

type counterAt struct {
	value float64
	at    time.Time
}

func newDCGMExposition() *dcgmExposition {
	help := map[string]string{
		dcgm.GPUUtil:        "GPU utilization (in %); a share's own SM use on a shared GPU (gpu-dra-driver, dcgm-exporter compatible).",
		dcgm.MemCopyUtil:    "Memory utilization (in %); a share's own on a shared GPU.",
		dcgm.FBUsed:         "Framebuffer memory used (in MiB); a share's own processes' on a shared GPU.",
		dcgm.FBFree:         "Framebuffer memory free (in MiB) on the GPU or MIG device.",
		dcgm.GPUTemp:        "GPU temperature (in C).",
		dcgm.PowerUsage:     "Power draw (in W).",
		dcgm.TotalEnergy:    "Total energy consumption since the driver was loaded (in mJ).",
		dcgm.SMClock:        "SM clock frequency (in MHz).",
		dcgm.MemClock:       "Memory clock frequency (in MHz).",
		dcgm.XIDErrors:      "Value of the last XID error encountered since the plugin started (0: none).",
		dcgm.GREngineActive: "Ratio of time the graphics engine is active: the GPU's utilization, a share's own SM use, or a MIG device's GPM SM utilization.",
		dcgm.NVLinkTxBytes:  "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
		dcgm.NVLinkRxBytes:  "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
	}
	e := &dcgmExposition{descs: map[string]*metrics.Desc{}, types: map[string]metrics.ValueType{},
		nvlink: map[string]counterAt{}, now: time.Now}
	for _, name := range dcgm.Metrics {
		e.descs[name] = metrics.NewDesc(name, help[name], dcgm.Labels, nil, metrics.ALPHA, "")
		e.types[name] = metrics.GaugeValue
	}
	e.types[dcgm.TotalEnergy] = metrics.CounterValue
	return e
}

func (e *dcgmExposition) describe(ch chan<- *metrics.Desc) {
	for _, name := range dcgm.Metrics {
		ch <- e.descs[name]
	}
}

// dcgmValues are one device's dcgm readings by metric name.
type dcgmValues map[string]float64

// collectDCGM emits device d's dcgm-compatible series. A device nobody holds
// and a whole device get one series per holder with the device's readings,
// as dcgm-exporter labels a GPU with the pod it is assigned to. A shared
// device (Holder.Shared) gets one series without holder labels with the
// device's readings, and one per holder whose utilization and used memory
// are the holder's own processes' (uses, from the per-container readings).
func (c *Collector) collectDCGM(ch chan<- metrics.Metric, d nvmlDevice, holders []Holder, uses map[string]*containerUse) {
	values := c.dcgmDeviceValues(d)
	shared := false
	for _, h := range holders {
		shared = shared || h.Shared
	}
	emit := func(v dcgmValues, h Holder) {
		labels := c.dcgmLabels(d, h)
		for _, name := range dcgm.Metrics {
			if x, ok := v[name]; ok {
				ch <- metrics.NewLazyConstMetric(c.dcgm.descs[name], c.dcgm.types[name], x, labels...)
			}
		}
	}
	if len(holders) == 0 || shared {
		emit(values, Holder{})
	}
	seen := map[string]bool{}
	for _, h := range holders {
		key := useKey(h)
		if seen[key] {
			continue
		}
		seen[key] = true
		v := values
		if u := uses[key]; u != nil && (shared || d.mig) {
			v = ownUse(values, u, shared, d.mig)
		}
		emit(v, h)
	}
}

// ownUse returns the device's values with the holder's own use: on a
// shared device its utilization and used memory, on a MIG device its GPU
// instance's GPM SM utilization as the engine activity (NVML has no
// utilization of MIG devices, and dcgm-exporter reports none either).
func ownUse(device dcgmValues, u *containerUse, shared, mig bool) dcgmValues {
	v := dcgmValues{}
	for k, x := range device {
		v[k] = x
	}
	if shared {
		delete(v, dcgm.GPUUtil)
		delete(v, dcgm.MemCopyUtil)
		delete(v, dcgm.GREngineActive)
		v[dcgm.FBUsed] = float64(u.memory) / mib
		if u.smKnown && !mig {
			v[dcgm.GPUUtil] = u.sm
		}
		if u.memKnown {
			v[dcgm.MemCopyUtil] = u.mem
		}
	}
	if u.smKnown {
		v[dcgm.GREngineActive] = u.sm / 100
	}
	return v
}

// dcgmLabels are the label values of device d held by h, in dcgm.Labels
// order. A MIG device carries its parent GPU's UUID and index with its GPU
// instance's ID and profile, as dcgm-exporter labels GPU instances.
func (c *Collector) dcgmLabels(d nvmlDevice, h Holder) []string {
	g := d.gpu
	profile, giID := "", ""
	if d.mig {
		giID = strconv.Itoa(d.giID)
		profile = migProfileName(d)
	}
	claimNS := ""
	if h.Claim != "" {
		claimNS = h.Namespace
	}
	return []string{strconv.Itoa(g.Index), g.UUID, g.PCIBusID, "nvidia" + strconv.Itoa(g.Minor), g.ProductName, c.opts.NodeName,
		profile, giID, h.Namespace, h.Pod, h.Container, h.Claim, claimNS, h.Device}
}

// migProfileName is the GPU-instance profile of MIG device d ("1g.10gb"),
// looked up in the GPU's profiles discovery read; empty when unknown.
func migProfileName(d nvmlDevice) string {
	if d.gpu.MIG == nil {
		return ""
	}
	gi, ret := d.parent.GetGpuInstanceById(d.giID)
	if ret != nvml.SUCCESS {
		return ""
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return ""
	}
	for _, p := range d.gpu.MIG.Profiles {
		if p.ID == info.ProfileId {
			return p.Name
		}
	}
	return ""
}

// dcgmDeviceValues reads device d's dcgm readings from NVML, in dcgm's
// units. Readings NVML does not give are left out, as in the native
// readings.
func (c *Collector) dcgmDeviceValues(d nvmlDevice) dcgmValues {
	v := dcgmValues{}
	h := d.handle
	if u, ret := h.GetUtilizationRates(); ret == nvml.SUCCESS {
		v[dcgm.GPUUtil], v[dcgm.MemCopyUtil], v[dcgm.GREngineActive] = float64(u.Gpu), float64(u.Memory), float64(u.Gpu)/100
	}
	if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
		v[dcgm.FBUsed], v[dcgm.FBFree] = float64(m.Used)/mib, float64(m.Free)/mib
	}
	if t, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		v[dcgm.GPUTemp] = float64(t)
	}
	if mw, ret := h.GetPowerUsage(); ret == nvml.SUCCESS {
		v[dcgm.PowerUsage] = float64(mw) / 1000
	}
	if mj, ret := h.GetTotalEnergyConsumption(); ret == nvml.SUCCESS {
		v[dcgm.TotalEnergy] = float64(mj)
	}
	if mhz, ret := h.GetClockInfo(nvml.CLOCK_SM); ret == nvml.SUCCESS {
		v[dcgm.SMClock] = float64(mhz)
	}
	if mhz, ret := h.GetClockInfo(nvml.CLOCK_MEM); ret == nvml.SUCCESS {
		v[dcgm.MemClock] = float64(mhz)
	}
	if d.mig {
		return v
	}
	if c.opts.XIDs != nil {
		xid, _ := c.opts.XIDs.LastXID(d.uuid)
		v[dcgm.XIDErrors] = float64(xid)
	}
	now := c.dcgm.now()
	// A fixed order (not a map's) keeps each counter's readings evenly
	// spaced among the scrape's NVML calls.
	for _, f := range []struct {
		name  string
		field uint32
	}{{dcgm.NVLinkTxBytes, nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX}, {dcgm.NVLinkRxBytes, nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX}} {
		name := f.name
		bytes, ok := nvlinkBytes(f.field)(h)
		if !ok {
			continue
		}
		key := d.uuid + "/" + name
		prev, seen := c.dcgm.nvlink[key]
		c.dcgm.nvlink[key] = counterAt{bytes, now}
		if dt := now.Sub(prev.at).Seconds(); seen && dt > 0 && bytes >= prev.value {
			v[name] = (bytes - prev.value) / dt
		}
	}
	return v
}
