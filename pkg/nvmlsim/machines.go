package nvmlsim

import (
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// gpuSpec describes one GPU model.
type gpuSpec struct {
	name           string // as GetName and nvidia-smi report it
	arch           nvml.DeviceArchitecture
	brand          nvml.BrandType
	ccMajor        int
	ccMinor        int
	pciDeviceID    uint32 // device<<16 | vendor, as in nvml.PciInfo.PciDeviceId
	pciSubsystemID uint32
	memoryMiB      uint64 // total memory as nvidia-smi shows it
	sms            uint32
	copyEngines    uint32
	decoders       uint32
	encoders       uint32
	jpegs          uint32
	ofas           uint32
	powerLimitW    uint32
	idlePowerW     uint32
	maxSMClockMHz  uint32
	maxMemClockMHz uint32
	pcieGen        int
	pcieWidth      int
	vbios          string
	mig            *migTable // nil: MIG not supported
}

// nvlinkSpec describes the NVLink wiring of each GPU of a machine.
type nvlinkSpec struct {
	version uint32
	// switchLinks[s] is how many consecutive links go to NVSwitch s; empty: no NVLink.
	switchLinks []int
	// switchBuses[s] is NVSwitch s's PCI bus (domain 0, device 0, function 0). ILLUSTRATIVE:
	// plausible values, not read from real systems.
	switchBuses []uint32
	// fabric: GetGpuFabricInfo reports a completed NVLink fabric (Hopper and later).
	fabric bool
	// imexChannels is how many IMEX channel device nodes the driver root has
	// (dev/nvidia-caps-imex-channels/channel<N>): multi-node NVLink trays only. The driver allows
	// 2048; fewer are made to keep driver roots small. ILLUSTRATIVE.
	imexChannels int
}

func (n *nvlinkSpec) links() int {
	total := 0
	for _, l := range n.switchLinks {
		total += l
	}
	return total
}

// switchOf returns the NVSwitch link l is wired to.
func (n *nvlinkSpec) switchOf(link int) int {
	for s, l := range n.switchLinks {
		if link < l {
			return s
		}
		link -= l
	}
	return -1
}

// machineSpec describes one simulated machine.
type machineSpec struct {
	name string
	gpu  *gpuSpec
	// buses[i] is GPU i's PCI bus; the bus ID is 0000:<bus>:00.0. roots[i] is the bus of the
	// PCIe root complex above it (sysfs devices/pci0000:<root>); numa[i] its NUMA node.
	buses []uint32
	roots []uint32
	numa  []int
	// nodeCPUs[n] is NUMA node n's cpulist; cpus the number of logical CPUs.
	nodeCPUs []string
	cpus     int
	nvlink   nvlinkSpec
	// upstream is the go-nvml mock machine whose driver, NVML and CUDA versions are served.
	upstream func() *server.Server
}

// fromUpstream takes architecture, brand and compute capability from a go-nvml mock GPU. Names,
// memory sizes and PCI device IDs are set per model below because the mocks differ from what
// the hardware reports (e.g. "Mock NVIDIA A100-SXM4-40GB", H200 PCI ID 0x2333).
func fromUpstream(c gpus.Config, s gpuSpec) *gpuSpec {
	s.arch, s.brand, s.ccMajor, s.ccMinor = c.Architecture, c.Brand, c.CudaMajor, c.CudaMinor
	return &s
}

var (
	a100 = fromUpstream(gpus.A100_SXM4_40GB, gpuSpec{
		name: "NVIDIA A100-SXM4-40GB", pciDeviceID: 0x20B010DE, pciSubsystemID: 0x134F10DE,
		memoryMiB: 40960, sms: 108, copyEngines: 7, decoders: 5, jpegs: 1, ofas: 1,
		powerLimitW: 400, idlePowerW: 52, maxSMClockMHz: 1410, maxMemClockMHz: 1215,
		pcieGen: 4, pcieWidth: 16, vbios: "92.00.36.00.02", mig: a100SXM440GB,
	})
	h100 = fromUpstream(gpus.H100_SXM5_80GB, gpuSpec{
		name: "NVIDIA H100 80GB HBM3", pciDeviceID: 0x233010DE, pciSubsystemID: 0x16C110DE,
		memoryMiB: 81559, sms: 132, copyEngines: 8, decoders: 7, jpegs: 7, ofas: 1,
		powerLimitW: 700, idlePowerW: 72, maxSMClockMHz: 1980, maxMemClockMHz: 2619,
		pcieGen: 5, pcieWidth: 16, vbios: "96.00.74.00.0D", mig: h10080GB,
	})
	// H200 SXM is PCI device 0x2335 and B200 0x2901 in the PCI ID database; the go-nvml mocks use
	// 0x2333 and 0x2B00.
	h200 = fromUpstream(gpus.H200_SXM5_141GB, gpuSpec{
		name: "NVIDIA H200", pciDeviceID: 0x233510DE, pciSubsystemID: 0x18BE10DE,
		memoryMiB: 143771, sms: 132, copyEngines: 8, decoders: 7, jpegs: 7, ofas: 1,
		powerLimitW: 700, idlePowerW: 76, maxSMClockMHz: 1980, maxMemClockMHz: 3201,
		pcieGen: 5, pcieWidth: 16, vbios: "96.00.A5.00.01", mig: h200141GB,
	})
	b200 = fromUpstream(gpus.B200_SXM5_180GB, gpuSpec{
		name: "NVIDIA B200", pciDeviceID: 0x290110DE, pciSubsystemID: 0x199910DE,
		memoryMiB: 183359, sms: 148, copyEngines: 16, decoders: 7, jpegs: 7, ofas: 1,
		powerLimitW: 1000, idlePowerW: 140, maxSMClockMHz: 1965, maxMemClockMHz: 3996,
		pcieGen: 5, pcieWidth: 16, vbios: "97.00.6E.00.05", mig: b200180GB,
	})
	// GB200 has no go-nvml mock of its own; it is a Blackwell GPU like B200, whose architecture and
	// compute capability it takes. ILLUSTRATIVE where not stated otherwise: name as nvidia-smi
	// shows it on GB200 NVL72 trays, 186 GB HBM3e (189471 MiB), PCI device 0x2941; the engine
	// counts, clocks and VBIOS are B200's.
	gb200 = fromUpstream(gpus.B200_SXM5_180GB, gpuSpec{
		name: "NVIDIA GB200", pciDeviceID: 0x294110DE, pciSubsystemID: 0x20D510DE,
		memoryMiB: 189471, sms: 152, copyEngines: 16, decoders: 7, jpegs: 7, ofas: 1,
		powerLimitW: 1200, idlePowerW: 150, maxSMClockMHz: 2062, maxMemClockMHz: 3996,
		pcieGen: 5, pcieWidth: 16, vbios: "97.00.82.00.0F", mig: b200180GB,
	})
	// L4 has no go-nvml mock: Ada Lovelace, compute capability 8.9, 58 SMs, 24 GB (23034 MiB as
	// nvidia-smi shows it), 2 NVENC, 4 NVDEC, 4 JPEG, 72 W, PCIe Gen4 x16, no MIG, no NVLink.
	l4 = &gpuSpec{
		name: "NVIDIA L4", arch: nvml.DEVICE_ARCH_ADA, brand: nvml.BRAND_NVIDIA, ccMajor: 8, ccMinor: 9,
		pciDeviceID: 0x27B810DE, pciSubsystemID: 0x16CA10DE,
		memoryMiB: 23034, sms: 58, copyEngines: 2, decoders: 4, encoders: 2, jpegs: 4, ofas: 1,
		powerLimitW: 72, idlePowerW: 16, maxSMClockMHz: 2040, maxMemClockMHz: 6251,
		pcieGen: 4, pcieWidth: 16, vbios: "95.04.29.00.06",
	}
)

func minus(buses []uint32, d uint32) []uint32 {
	out := make([]uint32, len(buses))
	for i, b := range buses {
		out[i] = b - d
	}
	return out
}

var dgxH100Buses = []uint32{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb}

var machines = map[string]*machineSpec{
	// DGX A100: GPUs in pairs behind one PCIe switch per AMD EPYC root complex.
	"dgxa100": {
		name: "dgxa100", gpu: a100,
		buses:    []uint32{0x07, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd},
		roots:    []uint32{0x00, 0x00, 0x40, 0x40, 0x80, 0x80, 0xa0, 0xa0},
		numa:     []int{0, 0, 0, 0, 1, 1, 1, 1},
		nodeCPUs: []string{"0-63,128-191", "64-127,192-255"}, cpus: 256,
		nvlink: nvlinkSpec{
			version:     3,
			switchLinks: []int{2, 2, 2, 2, 2, 2}, // 12 links, 2 to each of 6 NVSwitches
			switchBuses: []uint32{0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9},
		},
		upstream: dgxa100.New,
	},
	// DGX H100 / H200: each GPU behind its own root port; 18 links to 4 NVSwitch chips (5/4/4/5).
	"dgxh100": {
		name: "dgxh100", gpu: h100,
		buses: dgxH100Buses, roots: minus(dgxH100Buses, 3),
		numa:     []int{0, 0, 0, 0, 1, 1, 1, 1},
		nodeCPUs: []string{"0-55,112-167", "56-111,168-223"}, cpus: 224,
		nvlink: nvlinkSpec{
			version: 4, switchLinks: []int{5, 4, 4, 5},
			switchBuses: []uint32{0xe5, 0xe6, 0xe7, 0xe8}, fabric: true,
		},
		upstream: dgxh100.New,
	},
	"dgxh200": {
		name: "dgxh200", gpu: h200,
		buses: dgxH100Buses, roots: minus(dgxH100Buses, 3),
		numa:     []int{0, 0, 0, 0, 1, 1, 1, 1},
		nodeCPUs: []string{"0-55,112-167", "56-111,168-223"}, cpus: 224,
		nvlink: nvlinkSpec{
			version: 4, switchLinks: []int{5, 4, 4, 5},
			switchBuses: []uint32{0xe5, 0xe6, 0xe7, 0xe8}, fabric: true,
		},
		upstream: dgxh200.New,
	},
	// DGX B200: bus IDs as nvidia-smi shows them on DGX B200 systems; 18 links to 2 NVSwitch chips.
	"dgxb200": {
		name: "dgxb200", gpu: b200,
		buses: []uint32{0x1b, 0x43, 0x52, 0x61, 0x9d, 0xc3, 0xd1, 0xdf},
		roots: minus([]uint32{0x1b, 0x43, 0x52, 0x61, 0x9d, 0xc3, 0xd1, 0xdf}, 3),
		numa:  []int{0, 0, 0, 0, 1, 1, 1, 1},
		// nvidia-smi topo -m on DGX B200: CPU affinity 0-55,112-167 and 56-111,168-223.
		nodeCPUs: []string{"0-55,112-167", "56-111,168-223"}, cpus: 224,
		nvlink: nvlinkSpec{
			version: 5, switchLinks: []int{9, 9},
			switchBuses: []uint32{0xf5, 0xf6}, fabric: true,
		},
		upstream: dgxb200.New,
	},
	// GB200 NVL72 compute tray: two Grace CPUs with two GB200 GPUs each; every GPU has 18 NVLink 5
	// links, one to each NVSwitch chip of the rack's 9 switch trays, and reports the rack's cluster
	// UUID and clique (rack.go: "gb200nvl72@RACK[/CLIQUE]"). ILLUSTRATIVE: bus numbers (the real
	// trays put each GPU in its own PCI domain, 0008, 0009, 0018, 0019; here domain 0) and switch
	// buses (the switches sit in other trays, not on this tray's PCI tree).
	"gb200nvl72": {
		name: "gb200nvl72", gpu: gb200,
		buses:    []uint32{0x08, 0x09, 0x18, 0x19},
		roots:    []uint32{0x07, 0x07, 0x17, 0x17},
		numa:     []int{0, 0, 1, 1},
		nodeCPUs: []string{"0-71", "72-143"}, cpus: 144,
		nvlink: nvlinkSpec{
			version:     5,
			switchLinks: []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
			switchBuses: []uint32{0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf, 0xb0, 0xb1},
			fabric:      true, imexChannels: 64,
		},
		upstream: dgxb200.New,
	},
	// A 2-socket PCIe server with 4 L4s, 2 per socket, each on its own root port. It has no
	// go-nvml mock; it reports the versions of the dgxa100 mock.
	"l4x4": {
		name: "l4x4", gpu: l4,
		buses:    []uint32{0x01, 0x41, 0x81, 0xc1},
		roots:    []uint32{0x00, 0x40, 0x80, 0xc0},
		numa:     []int{0, 0, 1, 1},
		nodeCPUs: []string{"0-15,32-47", "16-31,48-63"}, cpus: 64,
		upstream: dgxa100.New,
	},
}

// Machines returns the names of the machines New can simulate, sorted.
func Machines() []string {
	names := make([]string, 0, len(machines))
	for name := range machines {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
