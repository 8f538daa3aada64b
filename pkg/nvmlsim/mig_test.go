package nvmlsim

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// migGPU returns GPU index of machine with MIG mode enabled.
func migGPU(t *testing.T, m *Machine, index int) nvml.Device {
	t.Helper()
	d := device(t, m, index)
	if status, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || status != nvml.SUCCESS {
		t.Fatalf("SetMigMode(enable): %v, %v", status, ret)
	}
	return d
}

// profileByID finds the GPU-instance profile NVML reports with ID id, as `nvidia-smi mig -lgip`
// does: by walking the profile indexes.
func profileByID(t *testing.T, d nvml.Device, id uint32) nvml.GpuInstanceProfileInfo {
	t.Helper()
	for i := 0; i < nvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
		info, ret := d.GetGpuInstanceProfileInfo(i)
		if ret == nvml.SUCCESS && info.Id == id {
			return info
		}
	}
	t.Fatalf("no GPU instance profile with ID %d", id)
	return nvml.GpuInstanceProfileInfo{}
}

// lgipp renders the placements like `nvidia-smi mig -lgipp`: profile ID -> "{0,2,4,6}:2".
func lgipp(t *testing.T, d nvml.Device) map[uint32]string {
	t.Helper()
	out := map[uint32]string{}
	for i := 0; i < nvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
		info, ret := d.GetGpuInstanceProfileInfo(i)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		if ret != nvml.SUCCESS {
			t.Fatalf("GetGpuInstanceProfileInfo(%d): %v", i, ret)
		}
		placements := get(d.GetGpuInstancePossiblePlacements(&info)).must(t, "GetGpuInstancePossiblePlacements")
		var starts []string
		for _, p := range placements {
			starts = append(starts, fmt.Sprint(p.Start))
		}
		out[info.Id] = fmt.Sprintf("{%s}:%d", strings.Join(starts, ","), placements[0].Size)
	}
	return out
}

func TestProfileTables(t *testing.T) {
	type row struct {
		name                        string
		instances, sms, memoryMiB   uint64
		dec, jpeg, ofa, copyEngines uint32
	}
	placements := map[uint32]string{
		19: "{0,1,2,3,4,5,6}:1", 20: "{0,1,2,3,4,5,6}:1", 15: "{0,2,4,6}:2",
		14: "{0,2,4}:2", 9: "{0,4}:4", 5: "{0}:4", 0: "{0}:8",
	}
	tests := map[string]map[uint32]row{
		"dgxa100": {
			19: {"1g.5gb", 7, 14, 4864, 0, 0, 0, 1}, 20: {"1g.5gb+me", 1, 14, 4864, 1, 1, 1, 1},
			15: {"1g.10gb", 4, 14, 9856, 1, 0, 0, 1}, 14: {"2g.10gb", 3, 28, 9856, 1, 0, 0, 2},
			9: {"3g.20gb", 2, 42, 19968, 2, 0, 0, 3}, 5: {"4g.20gb", 1, 56, 19968, 2, 0, 0, 4},
			0: {"7g.40gb", 1, 98, 40192, 5, 1, 1, 7},
		},
		"dgxh100": {
			19: {"1g.10gb", 7, 16, 9984, 1, 1, 0, 1}, 20: {"1g.10gb+me", 1, 16, 9984, 1, 1, 1, 1},
			15: {"1g.20gb", 4, 26, 20096, 1, 1, 0, 1}, 14: {"2g.20gb", 3, 32, 20096, 2, 2, 0, 2},
			9: {"3g.40gb", 2, 60, 40448, 3, 3, 0, 3}, 5: {"4g.40gb", 1, 64, 40448, 4, 4, 0, 4},
			0: {"7g.80gb", 1, 132, 81152, 7, 7, 1, 8},
		},
		"dgxh200": {
			19: {"1g.18gb", 7, 16, 16384, 1, 1, 0, 1}, 20: {"1g.18gb+me", 1, 16, 16384, 1, 1, 1, 1},
			15: {"1g.35gb", 4, 26, 33280, 1, 1, 0, 1}, 14: {"2g.35gb", 3, 32, 33280, 2, 2, 0, 2},
			9: {"3g.71gb", 2, 60, 67072, 3, 3, 0, 3}, 5: {"4g.71gb", 1, 64, 67072, 4, 4, 0, 4},
			0: {"7g.141gb", 1, 132, 143360, 7, 7, 1, 8},
		},
		"dgxb200": {
			19: {"1g.23gb", 7, 18, 20992, 1, 1, 0, 2}, 20: {"1g.23gb+me", 1, 18, 20992, 1, 1, 1, 2},
			15: {"1g.45gb", 4, 30, 45312, 1, 1, 0, 2}, 14: {"2g.45gb", 3, 36, 45312, 2, 2, 0, 4},
			9: {"3g.90gb", 2, 70, 91136, 3, 3, 0, 6}, 5: {"4g.90gb", 1, 72, 91136, 4, 4, 0, 8},
			0: {"7g.180gb", 1, 148, 182784, 7, 7, 1, 16},
		},
	}
	for machine, rows := range tests {
		t.Run(machine, func(t *testing.T) {
			m := started(t, machine)
			d := device(t, m, 0)
			if got := lgipp(t, d); !equalMaps(got, placements) {
				t.Errorf("-lgipp = %v, want %v", got, placements)
			}
			total := get(d.GetMemoryInfo()).must(t, "GetMemoryInfo").Total >> 20
			for id, want := range rows {
				info := profileByID(t, d, id)
				got := row{want.name, uint64(info.InstanceCount), uint64(info.MultiprocessorCount),
					info.MemorySizeMB, info.DecoderCount, info.JpegCount, info.OfaCount, info.CopyEngineCount}
				if got != want {
					t.Errorf("profile %d = %+v, want %+v", id, got, want)
				}
				if info.MemorySizeMB > total || info.EncoderCount != 0 || info.IsP2pSupported != 0 {
					t.Errorf("profile %d: %+v", id, info)
				}
			}
			// Profiles these GPUs lack, and indexes out of range.
			for _, index := range []int{nvml.GPU_INSTANCE_PROFILE_8_SLICE, nvml.GPU_INSTANCE_PROFILE_6_SLICE,
				nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME} {
				if _, ret := d.GetGpuInstanceProfileInfo(index); ret != nvml.ERROR_NOT_SUPPORTED {
					t.Errorf("GetGpuInstanceProfileInfo(%d): %v, want ERROR_NOT_SUPPORTED", index, ret)
				}
			}
			if _, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_COUNT); ret != nvml.ERROR_INVALID_ARGUMENT {
				t.Errorf("GetGpuInstanceProfileInfo(COUNT): %v, want ERROR_INVALID_ARGUMENT", ret)
			}
		})
	}
}

func equalMaps(a, b map[uint32]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestL4HasNoMIG(t *testing.T) {
	m := started(t, "l4x4")
	d := device(t, m, 0)
	if _, _, ret := d.GetMigMode(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GetMigMode: %v", ret)
	}
	if _, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("SetMigMode: %v", ret)
	}
	if _, ret := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GetGpuInstanceProfileInfo: %v", ret)
	}
	if _, ret := d.GetMaxMigDeviceCount(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GetMaxMigDeviceCount: %v", ret)
	}
}

// createAll creates GPU instances of profile id without placement until NVML refuses, and returns
// the placements' starts in creation order and the refusal.
func createAll(t *testing.T, d nvml.Device, id uint32) ([]uint32, nvml.Return) {
	t.Helper()
	info := profileByID(t, d, id)
	var starts []uint32
	for {
		gi, ret := d.CreateGpuInstance(&info)
		if ret != nvml.SUCCESS {
			return starts, ret
		}
		starts = append(starts, get(gi.GetInfo()).must(t, "GetInfo").Placement.Start)
	}
}

func TestPlacementExhaustion(t *testing.T) {
	for _, machine := range []string{"dgxa100", "dgxh100"} {
		t.Run(machine+"/seven 1g then no 2g", func(t *testing.T) {
			m := started(t, machine)
			d := migGPU(t, m, 0)
			starts, ret := createAll(t, d, 19)
			if len(starts) != 7 || ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
				t.Fatalf("created %d 1g instances then %v, want 7 then ERROR_INSUFFICIENT_RESOURCES", len(starts), ret)
			}
			twoG := profileByID(t, d, 14)
			if n := get(d.GetGpuInstanceRemainingCapacity(&twoG)).must(t, "GetGpuInstanceRemainingCapacity"); n != 0 {
				t.Fatalf("2g remaining capacity %d", n)
			}
			if _, ret := d.CreateGpuInstance(&twoG); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
				t.Fatalf("2g after seven 1g: %v", ret)
			}
		})
		t.Run(machine+"/two-slice 1g only at even starts", func(t *testing.T) {
			m := started(t, machine)
			d := migGPU(t, m, 0)
			starts, ret := createAll(t, d, 15)
			slices.Sort(starts)
			if !slices.Equal(starts, []uint32{0, 2, 4, 6}) || ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
				t.Fatalf("1g two-slice placements %v then %v, want [0 2 4 6] then ERROR_INSUFFICIENT_RESOURCES", starts, ret)
			}
			for _, gi := range m.GpuInstances(0) {
				if gi.Size != 2 {
					t.Errorf("GPU instance %+v: size %d, want 2", gi, gi.Size)
				}
			}
			oneG := profileByID(t, d, 19)
			if _, ret := d.CreateGpuInstance(&oneG); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
				t.Errorf("1g after four two-slice 1g: %v", ret)
			}
		})
	}
}

func TestPlacementRules(t *testing.T) {
	m := started(t, "dgxh100")
	d := device(t, m, 0)
	threeG := profileByID(t, d, 9)
	if _, ret := d.CreateGpuInstance(&threeG); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("CreateGpuInstance with MIG disabled: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	migGPU(t, m, 0)
	gi := get(d.CreateGpuInstanceWithPlacement(&threeG, &nvml.GpuInstancePlacement{Start: 4, Size: 4})).must(t, "3g at 4")
	tests := []struct {
		name      string
		profile   uint32
		placement nvml.GpuInstancePlacement
		want      nvml.Return
	}{
		{"overlapping 3g", 9, nvml.GpuInstancePlacement{Start: 4, Size: 4}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"2g inside the 3g", 14, nvml.GpuInstancePlacement{Start: 4, Size: 2}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"1g inside the 3g", 19, nvml.GpuInstancePlacement{Start: 6, Size: 1}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"odd start for 2g", 14, nvml.GpuInstancePlacement{Start: 1, Size: 2}, nvml.ERROR_INVALID_ARGUMENT},
		{"wrong size", 19, nvml.GpuInstancePlacement{Start: 0, Size: 2}, nvml.ERROR_INVALID_ARGUMENT},
		{"4g overlaps nothing", 5, nvml.GpuInstancePlacement{Start: 0, Size: 4}, nvml.SUCCESS},
		{"no room left", 19, nvml.GpuInstancePlacement{Start: 0, Size: 1}, nvml.ERROR_INSUFFICIENT_RESOURCES},
	}
	for _, tc := range tests {
		info := profileByID(t, d, tc.profile)
		if _, ret := d.CreateGpuInstanceWithPlacement(&info, &tc.placement); ret != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, ret, tc.want)
		}
	}
	if _, ret := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.ERROR_IN_USE {
		t.Errorf("disable MIG with GPU instances: %v, want ERROR_IN_USE", ret)
	}
	info := get(gi.GetInfo()).must(t, "GetInfo")
	if info.Id != 2 || info.ProfileId != 9 || info.Placement != (nvml.GpuInstancePlacement{Start: 4, Size: 4}) || info.Device != d {
		t.Errorf("3g GPU instance info %+v", info)
	}
}

// TestInstanceGeometry replays the MIG User Guide's examples on an A100-SXM4-40GB: the GPU
// instance IDs NVML assigns when nvidia-smi creates instances without placements.
func TestInstanceGeometry(t *testing.T) {
	tests := []struct {
		name     string
		profiles []uint32
		wantIDs  []uint32
		wantLast nvml.Return
	}{
		{"seven 1g.5gb", []uint32{19, 19, 19, 19, 19, 19, 19}, []uint32{13, 11, 12, 7, 8, 9, 10}, nvml.SUCCESS},
		{"4-2-1", []uint32{19, 14, 5}, []uint32{13, 5, 1}, nvml.SUCCESS},
		{"3-2-1-1", []uint32{9, 19, 14, 19}, []uint32{2, 7, 4, 8}, nvml.SUCCESS},
		{"3g last fails", []uint32{19, 19, 14, 9}, []uint32{13, 11, 3}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"2-1-1-1-1-1", []uint32{14, 19, 19, 19, 19, 19}, []uint32{5, 13, 7, 8, 9, 10}, nvml.SUCCESS},
		{"two 3g.20gb", []uint32{9, 9}, []uint32{2, 1}, nvml.SUCCESS},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := started(t, "dgxa100")
			d := migGPU(t, m, 0)
			var ids []uint32
			ret := nvml.SUCCESS
			for _, id := range tc.profiles {
				info := profileByID(t, d, id)
				var gi nvml.GpuInstance
				if gi, ret = d.CreateGpuInstance(&info); ret != nvml.SUCCESS {
					break
				}
				ids = append(ids, get(gi.GetInfo()).must(t, "GetInfo").Id)
			}
			if !slices.Equal(ids, tc.wantIDs) || ret != tc.wantLast {
				t.Fatalf("GPU instance IDs %v then %v, want %v then %v", ids, ret, tc.wantIDs, tc.wantLast)
			}
		})
	}
}

func TestComputeInstancesAndMigDevices(t *testing.T) {
	m := started(t, "dgxa100", WithSeed("node-x"))
	d := migGPU(t, m, 2)
	threeG := profileByID(t, d, 9)
	gi := get(d.CreateGpuInstanceWithPlacement(&threeG, &nvml.GpuInstancePlacement{Start: 0, Size: 4})).must(t, "3g")

	// `nvidia-smi mig -lcip` on a 3g.20gb GPU instance: 1c x3 (14 SMs), 2c x1 (28), 3g x1 (42).
	wantCIP := map[int][2]uint32{0: {3, 14}, 1: {1, 28}, 2: {1, 42}}
	for index := 0; index < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; index++ {
		info, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		want, ok := wantCIP[index]
		if !ok {
			if ret != nvml.ERROR_NOT_SUPPORTED {
				t.Errorf("CI profile %d: %v, want ERROR_NOT_SUPPORTED", index, ret)
			}
			continue
		}
		if ret != nvml.SUCCESS || [2]uint32{info.InstanceCount, info.MultiprocessorCount} != want ||
			info.SharedDecoderCount != 2 || info.SharedCopyEngineCount != 3 || info.Id != uint32(index) {
			t.Errorf("CI profile %d = %+v, %v; want instances/SMs %v", index, info, ret, want)
		}
	}

	oneC := get(gi.GetComputeInstanceProfileInfo(0, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)).must(t, "1c")
	var cis []nvml.ComputeInstance
	for i := 0; i < 3; i++ {
		cis = append(cis, get(gi.CreateComputeInstance(&oneC)).must(t, "CreateComputeInstance"))
	}
	if _, ret := gi.CreateComputeInstance(&oneC); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Fatalf("fourth 1c: %v", ret)
	}
	full := get(gi.GetComputeInstanceProfileInfo(2, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)).must(t, "3g CI")
	if _, ret := gi.CreateComputeInstance(&full); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Fatalf("full CI next to three 1c: %v", ret)
	}
	var ciIDs []uint32
	for _, ci := range cis {
		info := get(ci.GetInfo()).must(t, "CI GetInfo")
		if info.GpuInstance != gi || info.Device != d {
			t.Errorf("CI info %+v does not point to its GPU instance and GPU", info)
		}
		ciIDs = append(ciIDs, info.Id)
	}
	if !slices.Equal(ciIDs, []uint32{0, 1, 2}) {
		t.Errorf("CI IDs %v, want [0 1 2] as `nvidia-smi mig -cci 0,0,0` reports", ciIDs)
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Fatalf("destroy GPU instance with compute instances: %v, want ERROR_IN_USE", ret)
	}

	if n := get(d.GetMaxMigDeviceCount()).must(t, "GetMaxMigDeviceCount"); n != 7 {
		t.Errorf("GetMaxMigDeviceCount = %d", n)
	}
	migUUIDFormat := regexp.MustCompile(`^MIG-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	var uuids []string
	for i := 0; i < 3; i++ {
		mig := get(d.GetMigDeviceHandleByIndex(i)).must(t, "GetMigDeviceHandleByIndex")
		if !get(mig.IsMigDeviceHandle()).must(t, "IsMigDeviceHandle") {
			t.Errorf("MIG device %d is not a MIG handle", i)
		}
		if parent := get(mig.GetDeviceHandleFromMigDeviceHandle()).must(t, "parent"); parent != d {
			t.Errorf("MIG device %d parent is not GPU 2", i)
		}
		giID := get(mig.GetGpuInstanceId()).must(t, "GetGpuInstanceId")
		ciID := get(mig.GetComputeInstanceId()).must(t, "GetComputeInstanceId")
		if giID != 1 || ciID != i {
			t.Errorf("MIG device %d is GI %d CI %d, want GI 1 (3g at 0) CI %d", i, giID, ciID, i)
		}
		u := get(mig.GetUUID()).must(t, "GetUUID")
		if !migUUIDFormat.MatchString(u) {
			t.Errorf("MIG UUID %q", u)
		}
		uuids = append(uuids, u)
		attrs := get(mig.GetAttributes()).must(t, "GetAttributes")
		if attrs.MultiprocessorCount != 14 || attrs.GpuInstanceSliceCount != 3 || attrs.ComputeInstanceSliceCount != 1 ||
			attrs.MemorySizeMB != 19968 || attrs.SharedDecoderCount != 2 {
			t.Errorf("MIG device %d attributes %+v", i, attrs)
		}
		if mem := get(mig.GetMemoryInfo()).must(t, "GetMemoryInfo"); mem.Total != 19968<<20 {
			t.Errorf("MIG device memory %d", mem.Total)
		}
		if name := get(mig.GetName()).must(t, "GetName"); name != "NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb" {
			t.Errorf("MIG device name %q", name)
		}
		byUUID := get(m.DeviceGetHandleByUUID(u)).must(t, "DeviceGetHandleByUUID(MIG)")
		if byUUID != mig {
			t.Errorf("DeviceGetHandleByUUID(%s) returned another handle", u)
		}
	}
	if _, ret := d.GetMigDeviceHandleByIndex(3); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetMigDeviceHandleByIndex(3): %v, want ERROR_NOT_FOUND", ret)
	}
	if got := m.GpuInstances(2); len(got) != 1 || len(got[0].ComputeInstances) != 3 || got[0].ComputeInstances[1].UUID != uuids[1] {
		t.Errorf("GpuInstances(2) = %+v", got)
	}

	// The same GPU, GI and CI give the same MIG UUID on another process with the same seed.
	m2 := started(t, "dgxa100", WithSeed("node-x"))
	d2 := migGPU(t, m2, 2)
	gi2 := get(d2.CreateGpuInstanceWithPlacement(&threeG, &nvml.GpuInstancePlacement{Start: 0, Size: 4})).must(t, "3g")
	get(gi2.CreateComputeInstance(&oneC)).must(t, "1c")
	if u := get(get(d2.GetMigDeviceHandleByIndex(0)).must(t, "MIG 0").GetUUID()).must(t, "UUID"); u != uuids[0] {
		t.Errorf("MIG UUID %s differs from %s", u, uuids[0])
	}

	// Destroy: stale handles fail, the GPU instance can go once it is empty.
	stale := get(d.GetMigDeviceHandleByIndex(0)).must(t, "MIG 0")
	for _, ci := range cis {
		if ret := ci.Destroy(); ret != nvml.SUCCESS {
			t.Fatalf("destroy CI: %v", ret)
		}
	}
	if _, ret := stale.GetUUID(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("UUID of a destroyed MIG device: %v, want ERROR_INVALID_ARGUMENT", ret)
	}
	if ret := cis[0].Destroy(); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("destroy a destroyed CI: %v", ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatalf("destroy empty GPU instance: %v", ret)
	}
	if _, ret := d.GetGpuInstanceById(1); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetGpuInstanceById after destroy: %v", ret)
	}
	if status, ret := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); status != nvml.SUCCESS || ret != nvml.SUCCESS {
		t.Errorf("disable MIG when empty: %v %v", status, ret)
	}
	if cur, pending := get2(d.GetMigMode()); cur != nvml.DEVICE_MIG_DISABLE || pending != nvml.DEVICE_MIG_DISABLE {
		t.Errorf("MIG mode %d/%d after disable", cur, pending)
	}
}

func get2(a, b int, ret nvml.Return) (int, int) {
	if ret != nvml.SUCCESS {
		return -1, -1
	}
	return a, b
}

func TestComputeInstancePlacements(t *testing.T) {
	m := started(t, "dgxh100")
	d := migGPU(t, m, 0)
	sevenG := profileByID(t, d, 0)
	gi := get(d.CreateGpuInstance(&sevenG)).must(t, "7g")
	want := map[int]string{0: "{0,1,2,3,4,5,6}:1", 1: "{0,2,4}:2", 2: "{0,4}:3", 3: "{0}:4", 4: "{0}:7"}
	for index, w := range want {
		info := get(gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)).must(t, "CI profile")
		pls := get(gi.GetComputeInstancePossiblePlacements(&info)).must(t, "placements")
		var starts []string
		for _, p := range pls {
			starts = append(starts, fmt.Sprint(p.Start))
		}
		if got := fmt.Sprintf("{%s}:%d", strings.Join(starts, ","), pls[0].Size); got != w {
			t.Errorf("CI profile %d placements %s, want %s", index, got, w)
		}
	}
	fourC := get(gi.GetComputeInstanceProfileInfo(3, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)).must(t, "4c")
	threeC := get(gi.GetComputeInstanceProfileInfo(2, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)).must(t, "3c")
	get(gi.CreateComputeInstanceWithPlacement(&fourC, &nvml.ComputeInstancePlacement{Start: 0, Size: 4})).must(t, "4c at 0")
	if _, ret := gi.CreateComputeInstanceWithPlacement(&threeC, &nvml.ComputeInstancePlacement{Start: 0, Size: 3}); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("3c overlapping the 4c: %v", ret)
	}
	if n := get(gi.GetComputeInstanceRemainingCapacity(&threeC)).must(t, "remaining"); n != 1 {
		t.Errorf("3c remaining capacity %d, want 1", n)
	}
	ci := get(gi.CreateComputeInstance(&threeC)).must(t, "3c")
	if info := get(ci.GetInfo()).must(t, "info"); info.Placement != (nvml.ComputeInstancePlacement{Start: 4, Size: 3}) || info.Id != 1 {
		t.Errorf("3c info %+v", info)
	}
	if got := get(gi.GetComputeInstances(&threeC)).must(t, "GetComputeInstances"); len(got) != 1 || got[0] != ci {
		t.Errorf("GetComputeInstances(3c) = %v", got)
	}
	if got := get(gi.GetComputeInstanceById(1)).must(t, "GetComputeInstanceById"); got != ci {
		t.Errorf("GetComputeInstanceById(1) returned another CI")
	}
	if got := get(d.GetGpuInstances(&sevenG)).must(t, "GetGpuInstances"); len(got) != 1 || got[0] != gi {
		t.Errorf("GetGpuInstances(7g) = %v", got)
	}
}

func TestConcurrentMIGChanges(t *testing.T) {
	m := started(t, "dgxb200", WithStateFile(t.TempDir()+"/state.json"))
	var wg sync.WaitGroup
	for i := 0; i < m.GPUCount(); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, _ := m.DeviceGetHandleByIndex(i)
			d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
			info, _ := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
			for range 3 {
				var gis []nvml.GpuInstance
				for {
					gi, ret := d.CreateGpuInstance(&info)
					if ret != nvml.SUCCESS {
						break
					}
					gis = append(gis, gi)
				}
				if len(gis) != 7 {
					t.Errorf("GPU %d: %d 1g instances, want 7", i, len(gis))
				}
				for _, gi := range gis {
					if ret := gi.Destroy(); ret != nvml.SUCCESS {
						t.Errorf("GPU %d: destroy: %v", i, ret)
					}
				}
			}
		}()
	}
	wg.Wait()
	for i := 0; i < m.GPUCount(); i++ {
		if got := m.GpuInstances(i); len(got) != 0 {
			t.Errorf("GPU %d: %d GPU instances left", i, len(got))
		}
	}
}

func TestMediaExtensionProfile(t *testing.T) {
	m := started(t, "dgxh100")
	d := migGPU(t, m, 0)
	me := profileByID(t, d, 20)
	oneG := profileByID(t, d, 19)
	get(d.CreateGpuInstance(&me)).must(t, "1g.10gb+me")
	if _, ret := d.CreateGpuInstance(&me); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Fatalf("second +me instance: %v", ret)
	}
	if n := get(d.GetGpuInstanceRemainingCapacity(&oneG)).must(t, "remaining"); n != 6 {
		t.Fatalf("1g.10gb remaining next to 1g.10gb+me: %d, want 6", n)
	}
	starts, ret := createAll(t, d, 19)
	if len(starts) != 6 || ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Fatalf("created %d 1g.10gb next to +me, then %v", len(starts), ret)
	}
}
