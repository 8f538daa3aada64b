package nvmlsim

import (
	"fmt"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/loadsim"
)

// Simulated processes: the counterpart of CUDA programs. A process registers with the machine
// (RegisterProcess, or through the process socket, processsocket.go) the devices it uses (GPU or
// MIG UUIDs), the share of the SMs it keeps busy and the device memory it holds. NVML then lists it
// as a running compute process (or an MPS client), samples its utilization, and derives the
// device-wide readings from the processes: utilization is their sum capped at 100%, used memory
// their sum.

// Registration is what a simulated process declares (loadsim.Registration).
type Registration = loadsim.Registration

// process is a registered process. Guarded by Machine.mu.
type process struct {
	pid   uint32
	reg   Registration
	start time.Time
}

// ownerless is NVML's GPU and compute instance ID of a process not on a MIG device.
const ownerless = 0xFFFFFFFF

// RegisterProcess registers process pid with reg, replacing an earlier registration of pid. The
// returned function unregisters it (idempotent). Devices must exist and the memory fit each of
// them.
func (m *Machine) RegisterProcess(pid uint32, reg Registration) (unregister func(), err error) {
	if err := m.checkRegistration(pid, reg); err != nil {
		return nil, fmt.Errorf("register simulated process %d: %w", pid, err)
	}
	p := &process{pid: pid, reg: reg, start: time.Now()}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.processes[pid]; old != nil {
		m.retireLocked(old)
	}
	if m.processes == nil {
		m.processes = map[uint32]*process{}
	}
	m.processes[pid] = p
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.processes[pid] == p {
			m.retireLocked(p)
			delete(m.processes, pid)
		}
	}, nil
}

func (m *Machine) checkRegistration(pid uint32, reg Registration) error {
	switch {
	case pid == 0:
		return fmt.Errorf("pid 0")
	case len(reg.Devices) == 0:
		return fmt.Errorf("devices: none given")
	case reg.SMPercent > 100:
		return fmt.Errorf("smPercent %d: must be 0-100", reg.SMPercent)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, uuid := range reg.Devices {
		total, ok := m.deviceMemoryLocked(uuid)
		if !ok {
			return fmt.Errorf("devices: no GPU or MIG device %q", uuid)
		}
		if reg.MemoryBytes > total {
			return fmt.Errorf("memoryBytes %d: more than device %s has (%d)", reg.MemoryBytes, uuid, total)
		}
	}
	return nil
}

// deviceMemoryLocked returns the memory of the GPU or MIG device uuid. m.mu must be held.
func (m *Machine) deviceMemoryLocked(uuid string) (uint64, bool) {
	for _, g := range m.gpus {
		if g.uuid == uuid {
			return g.spec.memoryMiB << 20, true
		}
		for _, ci := range g.computeInstances() {
			if ci.uuid == uuid {
				return ci.gi.profile.memoryMiB << 20, true
			}
		}
	}
	return 0, false
}

// retireLocked adds an ending process's SM time to its devices' GPM counters. m.mu must be held.
func (m *Machine) retireLocked(p *process) {
	if m.smSecondsEnded == nil {
		m.smSecondsEnded = map[string]float64{}
	}
	for _, uuid := range p.reg.Devices {
		m.smSecondsEnded[uuid] += p.smSeconds(time.Now())
	}
}

// smSeconds is the process's SM time until t: SM percent × seconds.
func (p *process) smSeconds(t time.Time) float64 {
	return float64(p.reg.SMPercent) * t.Sub(p.start).Seconds()
}

// Processes returns the PIDs of the registered processes, sorted; a read-only view for tests.
func (m *Machine) Processes() []uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]uint32, 0, len(m.processes))
	for pid := range m.processes {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// onDeviceLocked returns the processes on the GPU or MIG device uuid, by PID. m.mu must be held.
func (m *Machine) onDeviceLocked(uuid string) []*process {
	var out []*process
	for _, p := range m.processes {
		if slices.Contains(p.reg.Devices, uuid) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *process) int { return int(a.pid) - int(b.pid) })
	return out
}

// gpuProcess is a process on g or one of its MIG devices, with the instance it runs on.
type gpuProcess struct {
	*process
	gi, ci uint32
	uuid   string
}

// processesLocked returns the processes on g: on the GPU itself, or, while MIG is enabled, on its
// MIG devices (with their instance IDs). m.mu must be held.
func (g *gpu) processesLocked() []gpuProcess {
	var out []gpuProcess
	if !g.migEnabled() {
		for _, p := range g.m.onDeviceLocked(g.uuid) {
			out = append(out, gpuProcess{process: p, gi: ownerless, ci: ownerless, uuid: g.uuid})
		}
		return out
	}
	for _, ci := range g.computeInstances() {
		for _, p := range g.m.onDeviceLocked(ci.uuid) {
			out = append(out, gpuProcess{process: p, gi: ci.gi.id, ci: ci.id, uuid: ci.uuid})
		}
	}
	return out
}

// processInfos lists procs as NVML does: the MPS clients, or the other compute processes.
func processInfos(procs []gpuProcess, mps bool) []nvml.ProcessInfo {
	out := []nvml.ProcessInfo{}
	for _, p := range procs {
		if p.reg.MPS == mps {
			out = append(out, nvml.ProcessInfo{Pid: p.pid, UsedGpuMemory: p.reg.MemoryBytes, GpuInstanceId: p.gi, ComputeInstanceId: p.ci})
		}
	}
	return out
}

// usage sums the SM percent (capped at 100) and memory of procs.
func usage(procs []gpuProcess) (smPercent uint32, memory uint64) {
	for _, p := range procs {
		smPercent += p.reg.SMPercent
		memory += p.reg.MemoryBytes
	}
	return min(smPercent, 100), memory
}

// setProcessFuncs sets the process methods of a whole-GPU handle.
func (g *gpu) setProcessFuncs(d *mock.Device) {
	list := func(mps bool) func() ([]nvml.ProcessInfo, nvml.Return) {
		return func() (out []nvml.ProcessInfo, ret nvml.Return) {
			g.locked(func() { out = processInfos(g.processesLocked(), mps) })
			return out, nvml.SUCCESS
		}
	}
	d.GetComputeRunningProcessesFunc = list(false)
	d.GetMPSComputeRunningProcessesFunc = list(true)
	d.GetProcessUtilizationFunc = func(lastSeen uint64) (out []nvml.ProcessUtilizationSample, ret nvml.Return) {
		g.locked(func() {
			if g.migEnabled() {
				// NVML does not sample processes on MIG devices; GPM measures the instances.
				ret = nvml.ERROR_NOT_SUPPORTED
				return
			}
			now := uint64(time.Now().UnixMicro())
			for _, p := range g.processesLocked() {
				out = append(out, nvml.ProcessUtilizationSample{Pid: p.pid, TimeStamp: now, SmUtil: p.reg.SMPercent, MemUtil: p.reg.SMPercent / 2})
			}
			ret = nvml.SUCCESS
			if len(out) == 0 || now <= lastSeen {
				out, ret = nil, nvml.ERROR_NOT_FOUND // no sample newer than lastSeen
			}
		})
		return out, ret
	}
	d.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) { return g.gpmSupport(), nvml.SUCCESS }
	d.GpmSampleGetFunc = func(s nvml.GpmSample) nvml.Return { return g.gpmSample(s, nil) }
	d.GpmMigSampleGetFunc = func(giID int, s nvml.GpmSample) nvml.Return {
		id := uint32(giID)
		return g.gpmSample(s, &id)
	}
}

// setProcessFuncs sets the process methods of a MIG device handle.
func (ci *computeInstance) setProcessFuncs(d *mock.Device) {
	g := ci.gi.gpu
	d.GetComputeRunningProcessesFunc = func() (out []nvml.ProcessInfo, ret nvml.Return) {
		g.locked(func() { out = processInfos(ci.processesLocked(), false) })
		return out, nvml.SUCCESS
	}
	d.GetMPSComputeRunningProcessesFunc = func() (out []nvml.ProcessInfo, ret nvml.Return) {
		g.locked(func() { out = processInfos(ci.processesLocked(), true) })
		return out, nvml.SUCCESS
	}
}

func (ci *computeInstance) processesLocked() []gpuProcess {
	var out []gpuProcess
	for _, p := range ci.gi.gpu.m.onDeviceLocked(ci.uuid) {
		out = append(out, gpuProcess{process: p, gi: ci.gi.id, ci: ci.id, uuid: ci.uuid})
	}
	return out
}
