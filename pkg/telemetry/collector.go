package telemetry

import (
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
)

const deviceSubsystem = "device"

// deviceLabels label every reading: the node, the measured NVIDIA device
// (uuid: GPU-… or MIG-…), its GPU's device name (gpu-0), the DRA device
// name it is allocated or published as, and its holder (empty while not
// allocated).
var deviceLabels = []string{"node", "uuid", "gpu", "device", "namespace", "pod", "claim", "container"}

// HealthSource gives the health of the GPUs; *health.Monitor implements it.
type HealthSource interface {
	Snapshot() health.Snapshot
}

// CollectorOptions configure a Collector.
type CollectorOptions struct {
	// NVML is an initialized NVML.
	NVML nvml.Interface
	// NodeName fills the node label.
	NodeName string
	// GPUs are the node's GPUs, as discovery found them.
	GPUs []discovery.GPU
	// Holders, if set, names the pods and claims holding each device.
	Holders HolderSource
	// Health, if set, adds gpu_dra_device_healthy.
	Health HealthSource
	// Processes, if set, attributes the processes NVML lists on each device
	// to pods and containers, for the per-container readings
	// (gpu_dra_container_*). Without it those readings carry no holder.
	Processes ProcessOwners
	// MIGDeviceName names a MIG device no claim holds as the device model
	// publishes it (devicemodel.StaticMIGDeviceName); nil leaves the device
	// label of such MIG devices empty.
	MIGDeviceName func(*discovery.GPU, mig.Instance) string
	// DCGM adds the dcgm-exporter-compatible series (DCGM_FI_*; see
	// dcgm.go and docs/telemetry.md).
	DCGM bool
	// XIDs, if set, gives the last XID of each GPU for DCGM_FI_DEV_XID_ERRORS;
	// DriverMetrics implements it.
	XIDs XIDSource
}

// Collector reads GPU and MIG device telemetry from NVML on every scrape.
// Readings a device does not support (NVML answers ERROR_NOT_SUPPORTED, as
// MIG devices do for temperature or power) are left out.
type Collector struct {
	metrics.BaseStableCollector
	opts CollectorOptions

	info, up, healthy *metrics.Desc
	readings          []*reading
	procReadings      processReadings
	procs             processState
	dcgm              *dcgmExposition // nil unless opts.DCGM
}

var _ metrics.StableCollector = (*Collector)(nil)

// NewCollector returns a collector; register it with
// KubeRegistry.CustomMustRegister (NewRegistry does).
func NewCollector(opts CollectorOptions) *Collector {
	c := &Collector{
		opts: opts,
		info: metrics.NewDesc(namespace+"_"+deviceSubsystem+"_info",
			"NVIDIA device (GPU or MIG device) present on the node; its model is in the label.",
			[]string{"node", "uuid", "gpu", "model"}, nil, metrics.ALPHA, ""),
		up: metrics.NewDesc(namespace+"_"+deviceSubsystem+"_up",
			"1 if NVML reaches the GPU, 0 if it is lost or unreachable.",
			[]string{"node", "uuid", "gpu"}, nil, metrics.ALPHA, ""),
		healthy: metrics.NewDesc(namespace+"_"+deviceSubsystem+"_healthy",
			"1 if the GPU and all its MIG instances are healthy, 0 if the driver considers any of them unhealthy (see docs/health.md).",
			[]string{"node", "uuid", "gpu"}, nil, metrics.ALPHA, ""),
		readings:     readings(),
		procReadings: newProcessReadings(),
		procs: processState{lastSeen: map[string]uint64{}, gpm: map[string]nvml.GpmSample{},
			gpmSupport: map[string]bool{}},
	}
	if opts.DCGM {
		c.dcgm = newDCGMExposition()
	}
	return c
}

// DescribeWithStability implements metrics.StableCollector.
func (c *Collector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- c.info
	ch <- c.up
	ch <- c.healthy
	for _, r := range c.readings {
		ch <- r.desc
	}
	c.procReadings.describe(ch)
	if c.dcgm != nil {
		c.dcgm.describe(ch)
	}
}

// nvmlDevice is one NVIDIA device to read: a GPU or one of its MIG devices.
type nvmlDevice struct {
	handle nvml.Device
	uuid   string
	gpu    *discovery.GPU
	// name is the device name when no claim holds it.
	name  string
	model string
	// mig marks a MIG device of GPU parent, in GPU instance giID.
	mig    bool
	parent nvml.Device
	giID   int
}

// CollectWithStability implements metrics.StableCollector.
func (c *Collector) CollectWithStability(ch chan<- metrics.Metric) {
	var holders map[string][]Holder
	if c.opts.Holders != nil {
		holders = c.opts.Holders.Holders()
	}
	var snap health.Snapshot
	if c.opts.Health != nil {
		snap = c.opts.Health.Snapshot()
	}
	c.beginProcesses()
	defer c.endProcesses()
	for i := range c.opts.GPUs {
		g := &c.opts.GPUs[i]
		gpuName := g.CanonicalName()
		if snap != nil {
			if st, ok := snap[g.UUID]; ok {
				ch <- metrics.NewLazyConstMetric(c.healthy, metrics.GaugeValue, boolValue(st.Healthy()), c.opts.NodeName, g.UUID, gpuName)
			}
		}
		handle, ret := c.opts.NVML.DeviceGetHandleByUUID(g.UUID)
		if ret == nvml.ERROR_NOT_FOUND {
			// Not on the nvidia driver: passed through to a virtual
			// machine (vfio-pci), whose guest owns its telemetry.
			klog.V(4).InfoS("GPU not on the nvidia driver, no telemetry", "gpu", g.UUID)
			continue
		}
		if ret == nvml.SUCCESS {
			// A handle can outlive the GPU; a query that reaches it tells.
			if _, r := handle.GetTemperature(nvml.TEMPERATURE_GPU); r == nvml.ERROR_GPU_IS_LOST {
				ret = r
			}
		}
		ch <- metrics.NewLazyConstMetric(c.up, metrics.GaugeValue, boolValue(ret == nvml.SUCCESS), c.opts.NodeName, g.UUID, gpuName)
		if ret != nvml.SUCCESS {
			klog.V(4).InfoS("Cannot read GPU telemetry", "gpu", g.UUID, "err", ret)
			continue
		}
		devices := append([]nvmlDevice{{handle: handle, uuid: g.UUID, gpu: g, name: gpuName, model: g.ProductName}}, migDevices(handle, g, c.opts.MIGDeviceName)...)
		for _, d := range devices {
			c.collectDevice(ch, d, holders[d.uuid])
			uses := c.collectProcesses(ch, d, holders[d.uuid])
			if c.dcgm != nil {
				c.collectDCGM(ch, d, holders[d.uuid], uses)
			}
		}
	}
}

// collectDevice emits d's info and readings, once per holder.
func (c *Collector) collectDevice(ch chan<- metrics.Metric, d nvmlDevice, holders []Holder) {
	gpuName := d.gpu.CanonicalName()
	ch <- metrics.NewLazyConstMetric(c.info, metrics.GaugeValue, 1, c.opts.NodeName, d.uuid, gpuName, d.model)
	var samples []sample
	for _, r := range c.readings {
		samples = append(samples, r.read(r, d.handle)...)
	}
	for _, labels := range holderLabels(c.opts.NodeName, d.uuid, gpuName, d.name, holders) {
		for _, s := range samples {
			ch <- metrics.NewLazyConstMetric(s.desc, s.valueType, s.value, append(slices.Clone(labels), s.extra...)...)
		}
	}
}

// holderLabels returns the distinct device label sets of a device: one per
// holder, or one without holder labels.
func holderLabels(node, uuid, gpu, name string, holders []Holder) [][]string {
	if len(holders) == 0 {
		return [][]string{{node, uuid, gpu, name, "", "", "", ""}}
	}
	seen := map[string]bool{}
	var out [][]string
	for _, h := range holders {
		device := h.Device
		if device == "" {
			device = name
		}
		labels := []string{node, uuid, gpu, device, h.Namespace, h.Pod, h.Claim, h.Container}
		if key := strings.Join(labels, "\x00"); !seen[key] {
			seen[key] = true
			out = append(out, labels)
		}
	}
	return out
}

// migDevices lists the MIG devices of GPU handle, named by name as static
// MIG devices are published (a claim's holder entry overrides the name).
func migDevices(handle nvml.Device, g *discovery.GPU, name func(*discovery.GPU, mig.Instance) string) []nvmlDevice {
	count, ret := handle.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil
	}
	var out []nvmlDevice
	for i := 0; i < count; i++ {
		md, ret := handle.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		uuid, ret := md.GetUUID()
		if ret != nvml.SUCCESS {
			continue
		}
		gi, ret1 := md.GetGpuInstanceId()
		ci, ret2 := md.GetComputeInstanceId()
		devName := ""
		if ret1 == nvml.SUCCESS && ret2 == nvml.SUCCESS && name != nil {
			devName = name(g, mig.Instance{GIID: uint32(gi), CIID: uint32(ci)})
		}
		model, ret := md.GetName()
		if ret != nvml.SUCCESS {
			model = g.ProductName + " MIG"
		}
		out = append(out, nvmlDevice{handle: md, uuid: uuid, gpu: g, name: devName, model: model, mig: true, parent: handle, giID: gi})
	}
	return out
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
