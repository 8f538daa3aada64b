package nvmlsim

import (
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// gpu is the state of one physical GPU. Fields are guarded by Machine.mu.
type gpu struct {
	m      *Machine
	spec   *gpuSpec
	index  int
	uuid   string
	serial string
	handle *mock.Device

	migCurrent  int
	migPending  int
	computeMode nvml.ComputeMode
	timeslice   int
	lost        bool
	// driver is the PCI driver the GPU is bound to ("" while unbound): NVML sees the GPU only
	// while it is DriverNVIDIA (pcibind.go).
	driver string
	// ECC error counters, raised by injected ECC events.
	eccCorrected   uint64
	eccUncorrected uint64
	// recoveryAction is what NVML_FI_DEV_GET_GPU_RECOVERY_ACTION reports: raised by XIDs
	// (recovery.go), cleared by ResetGPU and Reboot.
	recoveryAction nvml.DeviceGpuRecoveryAction

	gpuInstances map[uint32]*gpuInstance // by GPU-instance ID
}

func (m *Machine) newGPU(index int) *gpu {
	g := &gpu{
		m:            m,
		spec:         m.spec.gpu,
		index:        index,
		uuid:         gpuUUID(m.seed, m.spec.name, index),
		serial:       boardSerial(m.seed, m.spec.name, index),
		computeMode:  nvml.COMPUTEMODE_DEFAULT,
		driver:       DriverNVIDIA,
		gpuInstances: map[uint32]*gpuInstance{},
	}
	g.handle = g.newHandle()
	return g
}

// busID is the sysfs form of the PCI bus ID, e.g. "0000:18:00.0".
func (g *gpu) busID() string {
	return fmt.Sprintf("0000:%02x:00.0", g.m.spec.buses[g.index])
}

// nvmlBusID is NVML's form, e.g. "00000000:18:00.0".
func (g *gpu) nvmlBusID() string {
	return fmt.Sprintf("00000000:%02X:00.0", g.m.spec.buses[g.index])
}

func (g *gpu) numaNode() int {
	return g.m.spec.numa[g.index]
}

// computeInstances returns g's compute instances ordered by GPU-instance and compute-instance ID,
// the order of MIG device indexes.
func (g *gpu) computeInstances() []*computeInstance {
	var out []*computeInstance
	for _, gi := range g.sortedGpuInstances() {
		out = append(out, gi.sortedComputeInstances()...)
	}
	return out
}

func (g *gpu) sortedGpuInstances() []*gpuInstance {
	out := make([]*gpuInstance, 0, len(g.gpuInstances))
	for _, gi := range g.gpuInstances {
		out = append(out, gi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// deviceGuard fails calls on handles of GPU index: NVML not initialized, GPU lost, or an
// injected error.
func (m *Machine) deviceGuard(index int, prefix string) guard {
	return func(method string) (nvml.Return, bool) {
		m.calls.Add(1)
		return m.checkDevice(index, prefix+method)
	}
}

// checkDevice is deviceGuard's check, for calls already counted.
func (m *Machine) checkDevice(index int, method string) (nvml.Return, bool) {
	m.waitWhileHung()
	m.mu.Lock()
	defer m.mu.Unlock()
	if ret := m.checkInit(); ret != nvml.SUCCESS {
		return ret, true
	}
	if ret, fail := notInNVML(m.gpus[index]); fail {
		return ret, true
	}
	if m.gpus[index].lost {
		return nvml.ERROR_GPU_IS_LOST, true
	}
	return m.consumeFault(method, index)
}

// locked runs f with the machine lock held.
func (g *gpu) locked(f func()) {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	f()
}

func pciInfo(domain, bus uint32, deviceID, subsystemID uint32) nvml.PciInfo {
	p := nvml.PciInfo{Domain: domain, Bus: bus, PciDeviceId: deviceID, PciSubSystemId: subsystemID}
	copyCString(p.BusId[:], fmt.Sprintf("%08X:%02X:00.0", domain, bus))
	copyCString(p.BusIdLegacy[:], fmt.Sprintf("%04X:%02X:00.0", domain, bus))
	return p
}

func copyCString(dst []int8, s string) {
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}

// newHandle builds the nvml.Device of the whole GPU.
func (g *gpu) newHandle() *mock.Device {
	s := g.spec
	d := &mock.Device{}
	d.GetIndexFunc = func() (index int, _ nvml.Return) {
		g.locked(func() { index = g.nvmlIndex() })
		return index, nvml.SUCCESS
	}
	d.GetMinorNumberFunc = func() (int, nvml.Return) { return g.index, nvml.SUCCESS }
	d.GetUUIDFunc = func() (string, nvml.Return) { return g.uuid, nvml.SUCCESS }
	d.GetSerialFunc = func() (string, nvml.Return) { return g.serial, nvml.SUCCESS }
	d.GetNameFunc = func() (string, nvml.Return) { return s.name, nvml.SUCCESS }
	d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return s.brand, nvml.SUCCESS }
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return s.arch, nvml.SUCCESS }
	d.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return s.ccMajor, s.ccMinor, nvml.SUCCESS }
	d.GetVbiosVersionFunc = func() (string, nvml.Return) { return s.vbios, nvml.SUCCESS }
	d.GetBoardPartNumberFunc = func() (string, nvml.Return) {
		return fmt.Sprintf("699-2G%03X-0200-000", s.pciDeviceID>>20), nvml.SUCCESS
	}
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		return pciInfo(0, g.m.spec.buses[g.index], s.pciDeviceID, s.pciSubsystemID), nvml.SUCCESS
	}
	d.GetPciInfoExtFunc = func() (nvml.PciInfoExt, nvml.Return) {
		p := pciInfo(0, g.m.spec.buses[g.index], s.pciDeviceID, s.pciSubsystemID)
		ext := nvml.PciInfoExt{
			Domain: p.Domain, Bus: p.Bus, Device: p.Device, PciDeviceId: p.PciDeviceId,
			PciSubSystemId: p.PciSubSystemId, BaseClass: 0x03, SubClass: 0x02, BusId: p.BusId,
		}
		return ext, nvml.SUCCESS
	}
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return g.numaNode(), nvml.SUCCESS }
	// x86 hosts without ATS: heterogeneous memory management, as these GPUs report on DGX systems.
	d.GetAddressingModeFunc = func() (nvml.DeviceAddressingMode, nvml.Return) {
		return nvml.DeviceAddressingMode{Version: 1, Value: uint32(nvml.DEVICE_ADDRESSING_MODE_HMM)}, nvml.SUCCESS
	}
	if g.m.spec.nvlink.links() > 0 {
		// SXM modules on an HGX baseboard are numbered from 1; PCIe cards have no module ID.
		d.GetModuleIdFunc = func() (int, nvml.Return) { return g.index + 1, nvml.SUCCESS }
	}
	d.GetBoardIdFunc = func() (uint32, nvml.Return) { return uint32(g.m.spec.buses[g.index]) << 8, nvml.SUCCESS }
	d.GetCurrPcieLinkGenerationFunc = func() (int, nvml.Return) { return s.pcieGen, nvml.SUCCESS }
	d.GetMaxPcieLinkGenerationFunc = d.GetCurrPcieLinkGenerationFunc
	d.GetCurrPcieLinkWidthFunc = func() (int, nvml.Return) { return s.pcieWidth, nvml.SUCCESS }
	d.GetMaxPcieLinkWidthFunc = d.GetCurrPcieLinkWidthFunc
	d.GetTopologyCommonAncestorFunc = g.commonAncestor
	d.GetFieldValuesFunc = g.getFieldValues

	// Used memory is what the simulated processes hold.
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		total, used := s.memoryMiB<<20, g.usedMemory()
		return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
	}
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		total, used := s.memoryMiB<<20, g.usedMemory()
		reserved := total / 100 // the driver keeps roughly 1% for itself
		return nvml.Memory_v2{Version: nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2), Total: total,
			Reserved: reserved, Used: used, Free: total - reserved - min(used, total-reserved)}, nvml.SUCCESS
	}
	d.GetBAR1MemoryInfoFunc = func() (nvml.BAR1Memory, nvml.Return) {
		total := uint64(1) << 37 // 128 GiB BAR1 on SXM data-center GPUs
		if s.mig == nil {
			total = 32 << 30
		}
		return nvml.BAR1Memory{Bar1Total: total, Bar1Free: total - 1<<20, Bar1Used: 1 << 20}, nvml.SUCCESS
	}
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		// ASSUMED for a whole GPU: all SMs and engines, and the MIG slice counts for MIG-capable
		// GPUs (0 otherwise).
		a := nvml.DeviceAttributes{
			MultiprocessorCount: s.sms, SharedCopyEngineCount: s.copyEngines,
			SharedDecoderCount: s.decoders, SharedEncoderCount: s.encoders,
			SharedJpegCount: s.jpegs, SharedOfaCount: s.ofas, MemorySizeMB: s.memoryMiB,
		}
		if s.mig != nil {
			a.GpuInstanceSliceCount, a.ComputeInstanceSliceCount = 7, 7
		}
		return a, nvml.SUCCESS
	}
	d.GetComputeModeFunc = func() (mode nvml.ComputeMode, ret nvml.Return) {
		g.locked(func() { mode = g.computeMode })
		return mode, nvml.SUCCESS
	}
	d.SetComputeModeFunc = func(mode nvml.ComputeMode) nvml.Return {
		if mode < 0 || mode >= nvml.COMPUTEMODE_COUNT || mode == nvml.COMPUTEMODE_EXCLUSIVE_THREAD {
			// EXCLUSIVE_THREAD was removed in CUDA 8 and is rejected by current drivers.
			return nvml.ERROR_INVALID_ARGUMENT
		}
		var ret nvml.Return
		g.locked(func() {
			old := g.computeMode
			g.computeMode = mode
			ret = g.m.commit(func() { g.computeMode = old })
		})
		return ret
	}
	d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_ENABLED, nvml.SUCCESS }
	d.GetDisplayModeFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.SUCCESS }
	d.GetDisplayActiveFunc = d.GetDisplayModeFunc
	d.GetEccModeFunc = func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
		return nvml.FEATURE_ENABLED, nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetTotalEccErrorsFunc = g.totalEccErrors
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return g.supportedEvents(), nvml.SUCCESS }
	d.RegisterEventsFunc = g.registerEvents

	g.setTelemetryFuncs(d)
	g.setProcessFuncs(d)
	g.setNvLinkFuncs(d)
	g.setMigFuncs(d)
	finishMock(d, "Device", g.m.deviceGuard(g.index, ""))
	return d
}

// commonAncestor answers GetTopologyCommonAncestor from the PCIe layout: the same root complex is
// TOPOLOGY_HOSTBRIDGE, the same NUMA node TOPOLOGY_NODE, otherwise TOPOLOGY_SYSTEM.
func (g *gpu) commonAncestor(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
	var peer *gpu
	for _, o := range g.m.gpus {
		if nvml.Device(o.handle) == other {
			peer = o
		}
	}
	switch {
	case peer == nil:
		return 0, nvml.ERROR_INVALID_ARGUMENT
	case peer == g:
		return nvml.TOPOLOGY_INTERNAL, nvml.SUCCESS
	case g.m.spec.roots[peer.index] == g.m.spec.roots[g.index]:
		return nvml.TOPOLOGY_HOSTBRIDGE, nvml.SUCCESS
	case peer.numaNode() == g.numaNode():
		return nvml.TOPOLOGY_NODE, nvml.SUCCESS
	default:
		return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
	}
}

func (g *gpu) totalEccErrors(errorType nvml.MemoryErrorType, counter nvml.EccCounterType) (uint64, nvml.Return) {
	var n uint64
	g.locked(func() {
		switch errorType {
		case nvml.MEMORY_ERROR_TYPE_CORRECTED:
			n = g.eccCorrected
		case nvml.MEMORY_ERROR_TYPE_UNCORRECTED:
			n = g.eccUncorrected
		}
	})
	if counter != nvml.VOLATILE_ECC && counter != nvml.AGGREGATE_ECC {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	return n, nvml.SUCCESS
}
