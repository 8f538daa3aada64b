package nvmlsim

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/loadsim"
)

func register(t *testing.T, m *Machine, pid uint32, reg Registration) func() {
	t.Helper()
	unregister, err := m.RegisterProcess(pid, reg)
	if err != nil {
		t.Fatalf("RegisterProcess(%d): %v", pid, err)
	}
	return unregister
}

func pids(infos []nvml.ProcessInfo) []uint32 {
	var out []uint32
	for _, p := range infos {
		out = append(out, p.Pid)
	}
	return out
}

// Two time-sliced processes and an MPS client on one GPU: NVML lists and
// samples each, and the GPU-wide readings are their sums (utilization capped).
func TestProcessesOnWholeGPU(t *testing.T) {
	m := started(t, "dgxh100")
	d := device(t, m, 1)
	uuid := m.GPUUUID(1)
	register(t, m, 100, Registration{Devices: []string{uuid}, SMPercent: 30, MemoryBytes: 2 << 30})
	stop := register(t, m, 101, Registration{Devices: []string{uuid}, SMPercent: 60, MemoryBytes: 6 << 30})
	register(t, m, 102, Registration{Devices: []string{uuid}, SMPercent: 20, MemoryBytes: 1 << 30, MPS: true})
	register(t, m, 103, Registration{Devices: []string{m.GPUUUID(0)}, SMPercent: 99})

	procs := get(d.GetComputeRunningProcesses()).must(t, "GetComputeRunningProcesses")
	if got := pids(procs); !slices.Equal(got, []uint32{100, 101}) {
		t.Errorf("compute processes %v, want [100 101]", got)
	}
	if procs[1].UsedGpuMemory != 6<<30 || procs[1].GpuInstanceId != ownerless {
		t.Errorf("process 101 = %+v, want 6 GiB outside MIG", procs[1])
	}
	if got := pids(get(d.GetMPSComputeRunningProcesses()).must(t, "GetMPSComputeRunningProcesses")); !slices.Equal(got, []uint32{102}) {
		t.Errorf("MPS clients %v, want [102]", got)
	}
	samples := get(d.GetProcessUtilization(0)).must(t, "GetProcessUtilization")
	sm := map[uint32]uint32{}
	for _, s := range samples {
		sm[s.Pid] = s.SmUtil
	}
	if want := map[uint32]uint32{100: 30, 101: 60, 102: 20}; !maps(sm, want) {
		t.Errorf("SM samples %v, want %v", sm, want)
	}
	if _, ret := d.GetProcessUtilization(uint64(time.Now().Add(time.Hour).UnixMicro())); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("samples newer than the future: %v, want ERROR_NOT_FOUND", ret)
	}
	if u := get(d.GetUtilizationRates()).must(t, "GetUtilizationRates"); u.Gpu != 100 {
		t.Errorf("GPU utilization %d with 110%% of SM time declared, want 100 (capped)", u.Gpu)
	}
	if mem := get(d.GetMemoryInfo()).must(t, "GetMemoryInfo"); mem.Used != 9<<30 || mem.Free != mem.Total-9<<30 {
		t.Errorf("memory %+v, want 9 GiB used", mem)
	}

	stop()
	stop() // idempotent
	if u := get(d.GetUtilizationRates()).must(t, "GetUtilizationRates"); u.Gpu != 50 {
		t.Errorf("GPU utilization %d after process 101 ended, want 50", u.Gpu)
	}
	if got := m.Processes(); !slices.Equal(got, []uint32{100, 102, 103}) {
		t.Errorf("processes %v after one ended", got)
	}
}

func maps(a, b map[uint32]uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestRegisterProcessRefuses(t *testing.T) {
	m := started(t, "dgxh100")
	uuid := m.GPUUUID(0)
	tests := map[string]struct {
		pid  uint32
		reg  Registration
		want string
	}{
		"no devices":      {1, Registration{SMPercent: 1}, "devices"},
		"unknown device":  {1, Registration{Devices: []string{"GPU-nope"}}, `"GPU-nope"`},
		"over 100% SM":    {1, Registration{Devices: []string{uuid}, SMPercent: 101}, "smPercent 101"},
		"too much memory": {1, Registration{Devices: []string{uuid}, MemoryBytes: 1 << 40}, "memoryBytes"},
		"pid 0":           {0, Registration{Devices: []string{uuid}}, "pid 0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := m.RegisterProcess(tc.pid, tc.reg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("RegisterProcess = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// On MIG devices processes are listed by their MIG device and, with their
// instance IDs, by the GPU; NVML samples no process, and GPM measures each
// GPU instance's SM use between two samples.
func TestProcessesOnMIGDevices(t *testing.T) {
	m := started(t, "dgxh100")
	d := migGPU(t, m, 0)
	oneG := profileByID(t, d, 19)
	var migs []nvml.Device
	for range 2 {
		gi := get(d.CreateGpuInstance(&oneG)).must(t, "CreateGpuInstance")
		ciProfile := get(gi.GetComputeInstanceProfileInfo(0, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)).must(t, "CI profile")
		get(gi.CreateComputeInstance(&ciProfile)).must(t, "CreateComputeInstance")
	}
	var giIDs []int
	for i := range 2 {
		mig := get(d.GetMigDeviceHandleByIndex(i)).must(t, "MIG handle")
		migs = append(migs, mig)
		giIDs = append(giIDs, get(mig.GetGpuInstanceId()).must(t, "GI ID"))
	}
	uuid0 := get(migs[0].GetUUID()).must(t, "MIG UUID")
	register(t, m, 200, Registration{Devices: []string{uuid0}, SMPercent: 40, MemoryBytes: 1 << 30})

	if got := pids(get(migs[0].GetComputeRunningProcesses()).must(t, "MIG processes")); !slices.Equal(got, []uint32{200}) {
		t.Errorf("processes of the MIG device %v, want [200]", got)
	}
	if got := get(migs[1].GetComputeRunningProcesses()).must(t, "MIG processes"); len(got) != 0 {
		t.Errorf("processes of the idle MIG device %v", got)
	}
	parent := get(d.GetComputeRunningProcesses()).must(t, "GPU processes")
	if len(parent) != 1 || parent[0].GpuInstanceId != uint32(giIDs[0]) || parent[0].ComputeInstanceId != 0 {
		t.Errorf("GPU's processes %+v, want 200 in GPU instance %d", parent, giIDs[0])
	}
	if mem := get(migs[0].GetMemoryInfo()).must(t, "MIG memory"); mem.Used != 1<<30 {
		t.Errorf("MIG memory used %d, want 1 GiB", mem.Used)
	}
	if _, ret := d.GetProcessUtilization(0); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("process samples on a MIG-enabled GPU: %v, want ERROR_NOT_SUPPORTED", ret)
	}
	if s := get(m.GpmQueryDeviceSupport(d)).must(t, "GPM support"); s.IsSupportedDevice != 1 {
		t.Errorf("GPM not supported on an H100")
	}

	gpm := func(gi int) float64 {
		t.Helper()
		s1 := get(m.GpmSampleAlloc()).must(t, "GpmSampleAlloc")
		s2 := get(m.GpmSampleAlloc()).must(t, "GpmSampleAlloc")
		if ret := m.GpmMigSampleGet(d, gi, s1); ret != nvml.SUCCESS {
			t.Fatalf("GpmMigSampleGet: %v", ret)
		}
		time.Sleep(50 * time.Millisecond)
		if ret := s2.MigGet(d, gi); ret != nvml.SUCCESS {
			t.Fatalf("sample MigGet: %v", ret)
		}
		mg := nvml.GpmMetricsGetType{Version: nvml.GPM_METRICS_GET_VERSION, NumMetrics: 2, Sample1: s1, Sample2: s2}
		mg.Metrics[0].MetricId = uint32(nvml.GPM_METRIC_SM_UTIL)
		mg.Metrics[1].MetricId = uint32(nvml.GPM_METRIC_DRAM_BW_UTIL)
		if ret := m.GpmMetricsGet(&mg); ret != nvml.SUCCESS {
			t.Fatalf("GpmMetricsGet: %v", ret)
		}
		if nvml.Return(mg.Metrics[1].NvmlReturn) != nvml.ERROR_NOT_SUPPORTED {
			t.Errorf("DRAM bandwidth: %v, want ERROR_NOT_SUPPORTED", nvml.Return(mg.Metrics[1].NvmlReturn))
		}
		return mg.Metrics[0].Value
	}
	if got := gpm(giIDs[0]); got < 39 || got > 41 {
		t.Errorf("GPM SM utilization of the loaded instance %.2f, want 40", got)
	}
	if got := gpm(giIDs[1]); got != 0 {
		t.Errorf("GPM SM utilization of the idle instance %.2f, want 0", got)
	}
	if ret := m.GpmMigSampleGet(d, 14, get(m.GpmSampleAlloc()).must(t, "alloc")); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GPM sample of a missing GPU instance: %v, want ERROR_NOT_FOUND", ret)
	}
}

func TestGPMUnsupportedBeforeHopper(t *testing.T) {
	m := started(t, "dgxa100")
	d := device(t, m, 0)
	if s := get(m.GpmQueryDeviceSupport(d)).must(t, "GPM support"); s.IsSupportedDevice != 0 {
		t.Errorf("GPM supported on an A100")
	}
	if ret := d.GpmSampleGet(get(m.GpmSampleAlloc()).must(t, "alloc")); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GPM sample on an A100: %v, want ERROR_NOT_SUPPORTED", ret)
	}
}

// A load program registers over the socket with its own PID, is gone when
// it stops, and is refused with the machine's reason for a bad declaration.
func TestProcessSocket(t *testing.T) {
	m := started(t, "dgxh100")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sock := filepath.Join(t.TempDir(), ProcessSocket)
	if err := m.ServeProcesses(ctx, sock); err != nil {
		t.Fatal(err)
	}
	cfg := loadsim.Config{Socket: sock, Retry: 10 * time.Millisecond,
		Registration: Registration{Devices: []string{m.GPUUUID(3)}, SMPercent: 25, MemoryBytes: 1 << 20}}
	running := make(chan bool)
	done := make(chan error, 1)
	go func() { done <- loadsim.Run(ctx, cfg, running, io.Discard) }()
	self := uint32(os.Getpid())
	waitFor(t, "the load registered", func() bool { return slices.Equal(m.Processes(), []uint32{self}) })
	running <- false
	waitFor(t, "the stopped load unregistered", func() bool { return len(m.Processes()) == 0 })
	running <- true
	waitFor(t, "the resumed load registered", func() bool { return len(m.Processes()) == 1 })

	bad := cfg
	bad.Registration.Devices = []string{"GPU-missing"}
	var refused error
	if refused = loadsim.Run(ctx, bad, nil, &strings.Builder{}); refused == nil || !strings.Contains(refused.Error(), "GPU-missing") {
		t.Errorf("a load on a missing GPU: %v, want refused naming the device", refused)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	waitFor(t, "the canceled load unregistered", func() bool { return len(m.Processes()) == 0 })
	if errors.Is(refused, context.Canceled) {
		t.Error("refusal reported as cancellation")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
