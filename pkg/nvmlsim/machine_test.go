package nvmlsim

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// started returns an initialized machine that is shut down when the test ends.
func started(t *testing.T, machine string, opts ...Option) *Machine {
	t.Helper()
	m, err := New(machine, opts...)
	if err != nil {
		t.Fatalf("New(%q): %v", machine, err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	t.Cleanup(func() { m.Shutdown() })
	return m
}

// device returns GPU index's handle.
func device(t *testing.T, m *Machine, index int) nvml.Device {
	t.Helper()
	d, ret := m.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(%d): %v", index, ret)
	}
	return d
}

// result holds the two results of an NVML call, for get(call).must(t, "what").
type result[T any] struct {
	v   T
	ret nvml.Return
}

func get[T any](v T, ret nvml.Return) result[T] { return result[T]{v, ret} }

// must returns the value, failing the test unless the call succeeded.
func (r result[T]) must(t *testing.T, what string) T {
	t.Helper()
	if r.ret != nvml.SUCCESS {
		t.Fatalf("%s: %v", what, r.ret)
	}
	return r.v
}

func TestMachines(t *testing.T) {
	want := []string{"dgxa100", "dgxb200", "dgxh100", "dgxh200", "gb200nvl72", "l4x4"}
	if got := Machines(); !slices.Equal(got, want) {
		t.Fatalf("Machines() = %v, want %v", got, want)
	}
	_, err := New("dgx-nonexistent")
	if err == nil || !strings.Contains(err.Error(), "dgxa100, dgxb200, dgxh100, dgxh200, gb200nvl72, l4x4") {
		t.Fatalf("New(unknown) error = %v, want one listing the valid machines", err)
	}
}

func TestMachineIdentity(t *testing.T) {
	tests := map[string]struct {
		gpus      int
		name      string
		memoryMiB uint64
		arch      nvml.DeviceArchitecture
		cc        [2]int
		bus0      string
		numa      []int
		migCap    bool
		driver    string
		cuda      int
	}{
		"dgxa100": {8, "NVIDIA A100-SXM4-40GB", 40960, nvml.DEVICE_ARCH_AMPERE, [2]int{8, 0}, "00000000:07:00.0", []int{0, 0, 0, 0, 1, 1, 1, 1}, true, "550.54.15", 12040},
		"dgxh100": {8, "NVIDIA H100 80GB HBM3", 81559, nvml.DEVICE_ARCH_HOPPER, [2]int{9, 0}, "00000000:18:00.0", []int{0, 0, 0, 0, 1, 1, 1, 1}, true, "550.54.15", 12040},
		"dgxh200": {8, "NVIDIA H200", 143771, nvml.DEVICE_ARCH_HOPPER, [2]int{9, 0}, "00000000:18:00.0", []int{0, 0, 0, 0, 1, 1, 1, 1}, true, "550.54.15", 12040},
		"dgxb200": {8, "NVIDIA B200", 183359, nvml.DEVICE_ARCH_BLACKWELL, [2]int{10, 0}, "00000000:1B:00.0", []int{0, 0, 0, 0, 1, 1, 1, 1}, true, "560.28.03", 12060},
		"l4x4":    {4, "NVIDIA L4", 23034, nvml.DEVICE_ARCH_ADA, [2]int{8, 9}, "00000000:01:00.0", []int{0, 0, 1, 1}, false, "550.54.15", 12040},
	}
	for machine, tc := range tests {
		t.Run(machine, func(t *testing.T) {
			m := started(t, machine, WithSeed("node-a"))
			if got := get(m.DeviceGetCount()).must(t, "DeviceGetCount"); got != tc.gpus || m.GPUCount() != tc.gpus {
				t.Fatalf("DeviceGetCount = %d, GPUCount = %d, want %d", got, m.GPUCount(), tc.gpus)
			}
			if v := get(m.SystemGetDriverVersion()).must(t, "SystemGetDriverVersion"); v != tc.driver {
				t.Errorf("driver version %q, want %q", v, tc.driver)
			}
			if v := get(m.SystemGetCudaDriverVersion_v2()).must(t, "SystemGetCudaDriverVersion_v2"); v != tc.cuda {
				t.Errorf("CUDA driver version %d, want %d", v, tc.cuda)
			}
			if v := get(m.SystemGetNVMLVersion()).must(t, "SystemGetNVMLVersion"); v != "12."+tc.driver {
				t.Errorf("NVML version %q", v)
			}
			busIDs := map[string]bool{}
			for i := 0; i < tc.gpus; i++ {
				d := device(t, m, i)
				if name := get(d.GetName()).must(t, "GetName"); name != tc.name {
					t.Errorf("GPU %d name %q, want %q", i, name, tc.name)
				}
				mem := get(d.GetMemoryInfo()).must(t, "GetMemoryInfo")
				if mem.Total != tc.memoryMiB<<20 {
					t.Errorf("GPU %d memory %d MiB, want %d", i, mem.Total>>20, tc.memoryMiB)
				}
				if a := get(d.GetArchitecture()).must(t, "GetArchitecture"); a != tc.arch {
					t.Errorf("GPU %d architecture %v, want %v", i, a, tc.arch)
				}
				major, minor, ret := d.GetCudaComputeCapability()
				if ret != nvml.SUCCESS || [2]int{major, minor} != tc.cc {
					t.Errorf("GPU %d compute capability %d.%d (%v), want %v", i, major, minor, ret, tc.cc)
				}
				if idx := get(d.GetIndex()).must(t, "GetIndex"); idx != i {
					t.Errorf("GetIndex = %d, want %d", idx, i)
				}
				if minorNum := get(d.GetMinorNumber()).must(t, "GetMinorNumber"); minorNum != i {
					t.Errorf("GetMinorNumber = %d, want %d", minorNum, i)
				}
				if node := get(d.GetNumaNodeId()).must(t, "GetNumaNodeId"); node != tc.numa[i] {
					t.Errorf("GPU %d NUMA node %d, want %d", i, node, tc.numa[i])
				}
				pci := get(d.GetPciInfo()).must(t, "GetPciInfo")
				busID := cString(pci.BusId[:])
				if !regexp.MustCompile(`^00000000:[0-9A-F]{2}:00\.0$`).MatchString(busID) ||
					cString(pci.BusIdLegacy[:]) != busID[4:] || pci.Domain != 0 || pci.Device != 0 {
					t.Errorf("GPU %d PCI info %+v", i, pci)
				}
				if i == 0 && busID != tc.bus0 {
					t.Errorf("GPU 0 bus ID %s, want %s", busID, tc.bus0)
				}
				busIDs[busID] = true
				byBus := get(m.DeviceGetHandleByPciBusId(strings.ToLower(busID[4:]))).must(t, "DeviceGetHandleByPciBusId")
				if byBus != d {
					t.Errorf("DeviceGetHandleByPciBusId(%s) returned another GPU", busID)
				}
				_, _, ret = d.GetMigMode()
				if migCapable := ret == nvml.SUCCESS; migCapable != tc.migCap {
					t.Errorf("GPU %d GetMigMode: %v, MIG capable %v", i, ret, tc.migCap)
				}
			}
			if len(busIDs) != tc.gpus {
				t.Errorf("bus IDs not distinct: %v", busIDs)
			}
		})
	}
}

func cString(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}

func TestDGXH100BusIDs(t *testing.T) {
	m := started(t, "dgxh100")
	want := []string{"18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"}
	for i, bus := range want {
		pci := get(device(t, m, i).GetPciInfo()).must(t, "GetPciInfo")
		if got := cString(pci.BusId[:]); got != "00000000:"+bus+":00.0" {
			t.Errorf("GPU %d bus ID %s, want 00000000:%s:00.0", i, got, bus)
		}
	}
}

func TestDeterministicUUIDs(t *testing.T) {
	uuids := func(machine, seed string) []string {
		m := started(t, machine, WithSeed(seed))
		var out []string
		for i := 0; i < m.GPUCount(); i++ {
			out = append(out, get(device(t, m, i).GetUUID()).must(t, "GetUUID"))
		}
		return out
	}
	format := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for _, machine := range Machines() {
		a, b := uuids(machine, "node-a"), uuids(machine, "node-a")
		if !slices.Equal(a, b) {
			t.Errorf("%s: UUIDs differ between two machines with the same seed: %v %v", machine, a, b)
		}
		other := uuids(machine, "node-b")
		for i, u := range a {
			if !format.MatchString(u) {
				t.Errorf("%s GPU %d: UUID %q has not the GPU-xxxxxxxx-... form", machine, i, u)
			}
			if u == other[i] {
				t.Errorf("%s GPU %d: same UUID for different seeds", machine, i)
			}
			if seen[u] {
				t.Errorf("%s GPU %d: UUID %s not unique", machine, i, u)
			}
			seen[u] = true
		}
	}
	m := started(t, "dgxa100", WithSeed("node-a"))
	u := get(device(t, m, 3).GetUUID()).must(t, "GetUUID")
	d := get(m.DeviceGetHandleByUUID(u)).must(t, "DeviceGetHandleByUUID")
	if idx, _ := d.GetIndex(); idx != 3 {
		t.Errorf("DeviceGetHandleByUUID found GPU %d, want 3", idx)
	}
	if _, ret := m.DeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000"); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("unknown UUID: %v, want ERROR_NOT_FOUND", ret)
	}
}

func TestInitRequired(t *testing.T) {
	m, err := New("dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	if _, ret := m.DeviceGetCount(); ret != nvml.ERROR_UNINITIALIZED {
		t.Fatalf("DeviceGetCount before Init: %v, want ERROR_UNINITIALIZED", ret)
	}
	if ret := m.Shutdown(); ret != nvml.ERROR_UNINITIALIZED {
		t.Fatalf("Shutdown before Init: %v", ret)
	}
	m.Init()
	d := device(t, m, 0)
	m.Init()
	m.Shutdown()
	if _, ret := d.GetUUID(); ret != nvml.SUCCESS {
		t.Fatalf("GetUUID with one Init left: %v", ret)
	}
	m.Shutdown()
	if _, ret := d.GetUUID(); ret != nvml.ERROR_UNINITIALIZED {
		t.Fatalf("GetUUID after the last Shutdown: %v, want ERROR_UNINITIALIZED", ret)
	}
}

func TestInterfaceDelegatesToHandles(t *testing.T) {
	m := started(t, "dgxh100")
	d := device(t, m, 2)
	viaHandle := get(d.GetUUID()).must(t, "GetUUID")
	viaInterface := get(m.DeviceGetUUID(d)).must(t, "DeviceGetUUID")
	if viaHandle != viaInterface {
		t.Fatalf("DeviceGetUUID = %s, Device.GetUUID = %s", viaInterface, viaHandle)
	}
	if _, ret := m.DeviceGetUUID(nil); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Fatalf("DeviceGetUUID(nil): %v", ret)
	}
	// Methods the simulation does not model are unsupported, not panics.
	if _, ret := d.GetFanSpeed(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("GetFanSpeed: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	// Handler-returning methods cannot work without libnvidia-ml and say what to use instead.
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "GetGpuInstanceProfileInfo instead") {
			t.Fatalf("GetGpuInstanceProfileInfoV: recovered %v", r)
		}
	}()
	d.GetGpuInstanceProfileInfoV(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
}

func TestNvLink(t *testing.T) {
	tests := map[string]struct {
		links, switches int
		fabric          bool
	}{
		"dgxa100": {12, 6, false},
		"dgxh100": {18, 4, true},
		"dgxh200": {18, 4, true},
		"dgxb200": {18, 2, true},
		"l4x4":    {0, 0, false},
	}
	for machine, tc := range tests {
		t.Run(machine, func(t *testing.T) {
			m := started(t, machine, WithSeed("n1"))
			d := device(t, m, 1)
			active, remote := 0, map[string]bool{}
			for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
				state, ret := d.GetNvLinkState(link)
				if ret != nvml.SUCCESS {
					if ret != nvml.ERROR_NOT_SUPPORTED {
						t.Fatalf("link %d: %v", link, ret)
					}
					continue
				}
				if state != nvml.FEATURE_ENABLED {
					continue
				}
				active++
				if typ := get(d.GetNvLinkRemoteDeviceType(link)).must(t, "GetNvLinkRemoteDeviceType"); typ != nvml.NVLINK_DEVICE_TYPE_SWITCH {
					t.Errorf("link %d remote type %v", link, typ)
				}
				pci := get(d.GetNvLinkRemotePciInfo(link)).must(t, "GetNvLinkRemotePciInfo")
				remote[cString(pci.BusId[:])] = true
			}
			if active != tc.links || len(remote) != tc.switches {
				t.Errorf("%d active links to %d switches, want %d to %d", active, len(remote), tc.links, tc.switches)
			}
			info, ret := d.GetGpuFabricInfo()
			if !tc.fabric {
				if ret != nvml.ERROR_NOT_SUPPORTED {
					t.Errorf("GetGpuFabricInfo: %v, want ERROR_NOT_SUPPORTED", ret)
				}
				return
			}
			if ret != nvml.SUCCESS || info.State != nvml.GPU_FABRIC_STATE_COMPLETED ||
				info.Status != uint32(nvml.SUCCESS) || info.CliqueId != 1 || info.ClusterUuid == [16]uint8{} {
				t.Errorf("GetGpuFabricInfo = %+v, %v", info, ret)
			}
			other := get(device(t, m, 5).GetGpuFabricInfo()).must(t, "GetGpuFabricInfo")
			if other.ClusterUuid != info.ClusterUuid {
				t.Errorf("GPUs of one machine in different clusters")
			}
			v4 := get(d.GetGpuFabricInfo_v4()).must(t, "GetGpuFabricInfo_v4")
			if v4.ClusterUuid != info.ClusterUuid || v4.NumCliques != 1 || v4.Cliques[0].Id != 1 {
				t.Errorf("GetGpuFabricInfo_v4 = %+v", v4)
			}
		})
	}
}

func TestComputeMode(t *testing.T) {
	m := started(t, "l4x4")
	d := device(t, m, 0)
	if ret := d.SetComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_PROCESS); ret != nvml.SUCCESS {
		t.Fatalf("SetComputeMode: %v", ret)
	}
	if mode := get(d.GetComputeMode()).must(t, "GetComputeMode"); mode != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Fatalf("compute mode %v", mode)
	}
	if mode := get(device(t, m, 1).GetComputeMode()).must(t, "GetComputeMode"); mode != nvml.COMPUTEMODE_DEFAULT {
		t.Fatalf("other GPU's compute mode %v", mode)
	}
	if ret := d.SetComputeMode(nvml.ComputeMode(9)); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Fatalf("SetComputeMode(9): %v", ret)
	}
}

func TestTelemetry(t *testing.T) {
	m := started(t, "dgxb200")
	d := device(t, m, 0)
	temp := get(d.GetTemperature(nvml.TEMPERATURE_GPU)).must(t, "GetTemperature")
	power := get(d.GetPowerUsage()).must(t, "GetPowerUsage")
	limit := get(d.GetPowerManagementLimit()).must(t, "GetPowerManagementLimit")
	sm := get(d.GetClockInfo(nvml.CLOCK_SM)).must(t, "GetClockInfo")
	maxSM := get(d.GetMaxClockInfo(nvml.CLOCK_SM)).must(t, "GetMaxClockInfo")
	util := get(d.GetUtilizationRates()).must(t, "GetUtilizationRates")
	if temp < 20 || temp > 50 || power == 0 || power > limit || limit != 1000*1000 || sm == 0 || sm > maxSM || util.Gpu > 100 {
		t.Fatalf("implausible telemetry: %dC %dmW/%dmW SM %d/%d MHz util %+v", temp, power, limit, sm, maxSM, util)
	}
}
