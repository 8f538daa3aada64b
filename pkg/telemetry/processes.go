package telemetry

import (
	"slices"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/component-base/metrics"
)

const containerSubsystem = "container"

// ProcessOwner is the pod and container a process runs in, as its cgroup
// names them.
type ProcessOwner struct {
	PodUID string
	// ContainerID is the runtime's ID, without a scheme ("containerd://").
	ContainerID string
}

// ProcessOwners finds the pod and container of a process on a GPU;
// pkg/podattribution reads the process's cgroup once per process (its
// PID and start time: a reused PID is another process).
type ProcessOwners interface {
	// Owner returns the process's pod and container; false when it runs in
	// no pod or is gone.
	Owner(pid uint32) (ProcessOwner, bool)
	// Keep is called after each scrape with the PIDs it saw on the GPUs:
	// what is known of others may be forgotten.
	Keep(pids map[uint32]bool)
}

// ownerless is NVML's GPU instance ID of a process outside MIG.
const ownerless = 0xFFFFFFFF

// processReadings are the per-container readings; see docs/telemetry.md.
type processReadings struct {
	sm, memUtil, memUsed, memLimit, processes *metrics.Desc
}

func newProcessReadings() processReadings {
	desc := func(name, help string) *metrics.Desc {
		return metrics.NewDesc(namespace+"_"+containerSubsystem+"_"+name, help, deviceLabels, nil, metrics.ALPHA, "")
	}
	return processReadings{
		sm: desc("sm_utilization_ratio",
			"Fraction of the device's SM time the container's processes used since the previous scrape (NVML process utilization samples; GPM SM utilization of the GPU instance on MIG devices)."),
		memUtil: desc("memory_utilization_ratio",
			"Fraction of the time since the previous scrape the container's processes read or wrote device memory (NVML process utilization samples; absent on MIG devices)."),
		memUsed: desc("memory_used_bytes",
			"Device memory the container's processes hold (NVML running compute and MPS client processes)."),
		memLimit: desc("memory_limit_bytes",
			"Device memory the container's share limits it to or grants it: an MPS share's pinned memory limit, a time-slice share's memory capacity. Absent for whole GPUs and MIG devices (their limit is gpu_dra_device_memory_total_bytes)."),
		processes: desc("processes",
			"The container's processes on the device (compute processes and MPS clients)."),
	}
}

func (p processReadings) describe(ch chan<- *metrics.Desc) {
	for _, d := range []*metrics.Desc{p.sm, p.memUtil, p.memUsed, p.memLimit, p.processes} {
		ch <- d
	}
}

// processState is what the collector keeps between scrapes to measure
// "since the previous scrape": the newest process sample's timestamp per
// device, and the previous GPM sample and GPM support per GPU instance.
type processState struct {
	mu         sync.Mutex
	lastSeen   map[string]uint64
	gpm        map[string]nvml.GpmSample
	gpmSupport map[string]bool
	// seen are the devices and PIDs of the scrape in progress.
	seenDevices map[string]bool
	seenPIDs    map[uint32]bool
}

// procUse is one process on a device.
type procUse struct {
	pid     uint32
	memory  uint64
	sm, mem float64 // percent
}

// containerUse sums the processes of one holder on a device. smKnown and
// memKnown say whether sm and mem are measurements (NVML sampled them, or
// the holder runs nothing).
type containerUse struct {
	holder            Holder
	processes         int
	memory            uint64
	sm, mem           float64
	smKnown, memKnown bool
}

// useKey identifies a holder's use of one device.
func useKey(h Holder) string {
	return h.Namespace + "/" + h.Pod + "/" + h.Container + "/" + h.Claim + "/" + h.Device
}

// beginProcesses starts the process part of a scrape; endProcesses ends it.
func (c *Collector) beginProcesses() {
	s := &c.procs
	s.mu.Lock()
	s.seenDevices, s.seenPIDs = map[string]bool{}, map[uint32]bool{}
}

func (c *Collector) endProcesses() {
	s := &c.procs
	defer s.mu.Unlock()
	for uuid, sample := range s.gpm {
		if !s.seenDevices[uuid] {
			_ = sample.Free()
			delete(s.gpm, uuid)
			delete(s.lastSeen, uuid)
		}
	}
	if c.opts.Processes != nil {
		c.opts.Processes.Keep(s.seenPIDs)
	}
}

// collectProcesses emits the per-container readings of device d and
// returns them by useKey.
func (c *Collector) collectProcesses(ch chan<- metrics.Metric, d nvmlDevice, holders []Holder) map[string]*containerUse {
	c.procs.seenDevices[d.uuid] = true
	procs, smOK, memOK := c.deviceProcesses(d)
	uses := map[string]*containerUse{}
	var order []string
	use := func(h Holder) *containerUse {
		key := useKey(h)
		u := uses[key]
		if u == nil {
			u = &containerUse{holder: h}
			uses[key] = u
			order = append(order, key)
		}
		return u
	}
	// Every holder is shown, at zero while it runs nothing on the device:
	// a load that stops drops to 0 rather than vanishing.
	for _, h := range holders {
		use(h)
	}
	for _, p := range procs {
		c.procs.seenPIDs[p.pid] = true
		u := use(c.holderOf(p.pid, holders))
		u.processes++
		u.memory += p.memory
		if d.mig {
			u.sm = p.sm // the instance's, measured once for all its processes
		} else {
			u.sm += p.sm
		}
		u.mem += p.mem
	}
	gpuName := d.gpu.CanonicalName()
	for _, key := range order {
		u := uses[key]
		device := u.holder.Device
		if device == "" {
			device = d.name
		}
		labels := []string{c.opts.NodeName, d.uuid, gpuName, device, u.holder.Namespace, u.holder.Pod, u.holder.Claim, u.holder.Container}
		ch <- metrics.NewLazyConstMetric(c.procReadings.processes, metrics.GaugeValue, float64(u.processes), labels...)
		ch <- metrics.NewLazyConstMetric(c.procReadings.memUsed, metrics.GaugeValue, float64(u.memory), labels...)
		if u.holder.MemoryLimitBytes > 0 {
			ch <- metrics.NewLazyConstMetric(c.procReadings.memLimit, metrics.GaugeValue, float64(u.holder.MemoryLimitBytes), labels...)
		}
		// Without processes nothing ran: 0 is a measurement, not a guess.
		u.smKnown = u.processes == 0 || smOK
		u.memKnown = !d.mig && (u.processes == 0 || memOK)
		u.sm, u.mem = min(u.sm, 100), min(u.mem, 100)
		if u.smKnown {
			ch <- metrics.NewLazyConstMetric(c.procReadings.sm, metrics.GaugeValue, u.sm/100, labels...)
		}
		if u.memKnown {
			ch <- metrics.NewLazyConstMetric(c.procReadings.memUtil, metrics.GaugeValue, u.mem/100, labels...)
		}
	}
	return uses
}

// deviceProcesses lists the processes on d with their memory and, when
// NVML measures them, their SM and memory utilization.
func (c *Collector) deviceProcesses(d nvmlDevice) (procs []procUse, smOK, memOK bool) {
	for _, list := range []func() ([]nvml.ProcessInfo, nvml.Return){d.handle.GetComputeRunningProcesses, d.handle.GetMPSComputeRunningProcesses} {
		infos, ret := list()
		if ret != nvml.SUCCESS {
			continue
		}
		for _, info := range infos {
			// A GPU's list includes the processes of its MIG devices, which
			// are measured there.
			if !d.mig && info.GpuInstanceId != ownerless {
				continue
			}
			procs = append(procs, procUse{pid: info.Pid, memory: info.UsedGpuMemory})
		}
	}
	if len(procs) == 0 {
		return nil, false, false
	}
	if d.mig {
		util, ok := c.gpmUtilization(d)
		for i := range procs {
			procs[i].sm = util
		}
		return procs, ok, false
	}
	sm, mem, ok := c.processUtilization(d)
	for i := range procs {
		procs[i].sm, procs[i].mem = sm[procs[i].pid], mem[procs[i].pid]
	}
	return procs, ok, ok
}

// processUtilization averages the samples of each process since the
// previous scrape. No sample since then means no kernel ran: 0.
func (c *Collector) processUtilization(d nvmlDevice) (sm, mem map[uint32]float64, ok bool) {
	s := &c.procs
	samples, ret := d.handle.GetProcessUtilization(s.lastSeen[d.uuid])
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_FOUND:
		return nil, nil, true
	default:
		return nil, nil, false
	}
	sm, mem = map[uint32]float64{}, map[uint32]float64{}
	n := map[uint32]float64{}
	for _, smp := range samples {
		if smp.TimeStamp <= s.lastSeen[d.uuid] {
			continue
		}
		sm[smp.Pid] += float64(smp.SmUtil)
		mem[smp.Pid] += float64(smp.MemUtil)
		n[smp.Pid]++
	}
	for _, smp := range samples {
		s.lastSeen[d.uuid] = max(s.lastSeen[d.uuid], smp.TimeStamp)
	}
	for pid, count := range n {
		sm[pid] /= count
		mem[pid] /= count
	}
	return sm, mem, true
}

// gpmUtilization is the SM utilization (percent) of MIG device d's GPU
// instance between the previous scrape's GPM sample and one taken now; not
// ok on the first scrape and where GPM is not supported (before Hopper).
func (c *Collector) gpmUtilization(d nvmlDevice) (float64, bool) {
	s := &c.procs
	supported, known := s.gpmSupport[d.gpu.UUID]
	if !known {
		support, ret := c.opts.NVML.GpmQueryDeviceSupport(d.parent)
		supported = ret == nvml.SUCCESS && support.IsSupportedDevice != 0
		s.gpmSupport[d.gpu.UUID] = supported
	}
	if !supported {
		return 0, false
	}
	sample, ret := c.opts.NVML.GpmSampleAlloc()
	if ret != nvml.SUCCESS {
		return 0, false
	}
	if ret := c.opts.NVML.GpmMigSampleGet(d.parent, d.giID, sample); ret != nvml.SUCCESS {
		_ = sample.Free()
		return 0, false
	}
	prev := s.gpm[d.uuid]
	s.gpm[d.uuid] = sample
	if prev == nil {
		return 0, false
	}
	defer func() { _ = prev.Free() }()
	mg := nvml.GpmMetricsGetType{Version: nvml.GPM_METRICS_GET_VERSION, NumMetrics: 1, Sample1: prev, Sample2: sample}
	mg.Metrics[0].MetricId = uint32(nvml.GPM_METRIC_SM_UTIL)
	if ret := c.opts.NVML.GpmMetricsGet(&mg); ret != nvml.SUCCESS || nvml.Return(mg.Metrics[0].NvmlReturn) != nvml.SUCCESS {
		return 0, false
	}
	return mg.Metrics[0].Value, true
}

// holderOf attributes process pid to one of the device's holders: the
// container whose ID its cgroup names, else the pod's only holder, else the
// pod without a container. A process of no known holder is attributed to
// nobody (empty labels).
func (c *Collector) holderOf(pid uint32, holders []Holder) Holder {
	if c.opts.Processes == nil {
		return Holder{}
	}
	owner, ok := c.opts.Processes.Owner(pid)
	if !ok || owner.PodUID == "" {
		return Holder{}
	}
	var ofPod []Holder
	for _, h := range holders {
		if h.PodUID != owner.PodUID {
			continue
		}
		if owner.ContainerID != "" && slices.Contains(h.ContainerIDs, owner.ContainerID) {
			return h
		}
		ofPod = append(ofPod, h)
	}
	if len(ofPod) == 0 {
		return Holder{}
	}
	h := ofPod[0]
	for _, o := range ofPod[1:] {
		if o.Container != h.Container {
			h.Container, h.ContainerIDs = "", nil
			break
		}
	}
	return h
}
