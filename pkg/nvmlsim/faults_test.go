package nvmlsim

import (
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestInjectError(t *testing.T) {
	tests := []struct {
		name   string
		method string
		gpu    int
		times  int
		// calls of method on GPU 0 and GPU 1, in order, and the result each must give
		calls []struct {
			gpu  int
			want nvml.Return
		}
	}{
		{"twice on GPU 0", "GetUUID", 0, 2, []struct {
			gpu  int
			want nvml.Return
		}{{1, nvml.SUCCESS}, {0, nvml.ERROR_UNKNOWN}, {0, nvml.ERROR_UNKNOWN}, {0, nvml.SUCCESS}}},
		{"once on any GPU", "Device.GetUUID", -1, 1, []struct {
			gpu  int
			want nvml.Return
		}{{1, nvml.ERROR_UNKNOWN}, {0, nvml.SUCCESS}, {1, nvml.SUCCESS}}},
		{"forever", "GetUUID", 1, -1, []struct {
			gpu  int
			want nvml.Return
		}{{1, nvml.ERROR_UNKNOWN}, {1, nvml.ERROR_UNKNOWN}, {1, nvml.ERROR_UNKNOWN}, {0, nvml.SUCCESS}}},
		{"other method", "GetMemoryInfo", -1, -1, []struct {
			gpu  int
			want nvml.Return
		}{{0, nvml.SUCCESS}, {1, nvml.SUCCESS}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := started(t, "dgxh200")
			m.InjectError(tc.method, tc.gpu, nvml.ERROR_UNKNOWN, tc.times)
			for i, c := range tc.calls {
				uuid, ret := device(t, m, c.gpu).GetUUID()
				if ret != c.want || (ret != nvml.SUCCESS && uuid != "") {
					t.Fatalf("call %d on GPU %d: %q, %v; want %v", i, c.gpu, uuid, ret, c.want)
				}
			}
			m.ClearErrors()
			if _, ret := device(t, m, 1).GetUUID(); ret != nvml.SUCCESS {
				t.Fatalf("after ClearErrors: %v", ret)
			}
		})
	}
}

func TestInjectErrorOnMIGAndInterface(t *testing.T) {
	m := started(t, "dgxh100")
	d := migGPU(t, m, 0)
	oneG := profileByID(t, d, 19)
	m.InjectError("CreateGpuInstance", 0, nvml.ERROR_INSUFFICIENT_RESOURCES, 1)
	if _, ret := d.CreateGpuInstance(&oneG); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Fatalf("injected CreateGpuInstance: %v", ret)
	}
	if len(m.GpuInstances(0)) != 0 {
		t.Fatal("a failed call created a GPU instance")
	}
	gi := get(d.CreateGpuInstance(&oneG)).must(t, "CreateGpuInstance")
	m.InjectError("GpuInstance.Destroy", 0, nvml.ERROR_IN_USE, 1)
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Fatalf("injected GpuInstance.Destroy: %v", ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatalf("GpuInstance.Destroy: %v", ret)
	}
	m.InjectError("DeviceGetHandleByIndex", 4, nvml.ERROR_UNKNOWN, 1)
	if _, ret := m.DeviceGetHandleByIndex(3); ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(3): %v", ret)
	}
	if _, ret := m.DeviceGetHandleByIndex(4); ret != nvml.ERROR_UNKNOWN {
		t.Fatalf("injected DeviceGetHandleByIndex(4): %v", ret)
	}
	m.InjectError("DeviceGetCount", -1, nvml.ERROR_DRIVER_NOT_LOADED, 1)
	if _, ret := m.DeviceGetCount(); ret != nvml.ERROR_DRIVER_NOT_LOADED {
		t.Fatalf("injected DeviceGetCount: %v", ret)
	}
}

func TestGPULost(t *testing.T) {
	m := started(t, "dgxa100")
	d := device(t, m, 2)
	set := get(m.EventSetCreate()).must(t, "EventSetCreate")
	defer set.Free()
	if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := m.SetGPULost(2, true); err != nil {
		t.Fatal(err)
	}
	ev := get(set.Wait(1000)).must(t, "Wait")
	if ev.EventType != nvml.EventTypeXidCriticalError || ev.EventData != 79 || ev.Device != d {
		t.Fatalf("event on losing the GPU %+v, want XID 79", ev)
	}
	if _, ret := d.GetUUID(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("GetUUID on a lost GPU: %v", ret)
	}
	if _, ret := m.DeviceGetHandleByIndex(2); ret != nvml.ERROR_GPU_IS_LOST {
		t.Fatalf("DeviceGetHandleByIndex of a lost GPU: %v", ret)
	}
	if _, ret := device(t, m, 3).GetUUID(); ret != nvml.SUCCESS {
		t.Fatalf("other GPU: %v", ret)
	}
	if err := m.SetGPULost(2, false); err != nil {
		t.Fatal(err)
	}
	if _, ret := d.GetUUID(); ret != nvml.SUCCESS {
		t.Fatalf("GetUUID after restore: %v", ret)
	}
	if err := m.SetGPULost(8, true); err == nil {
		t.Fatal("SetGPULost(8) on an 8-GPU machine succeeded")
	}
}

func TestEvents(t *testing.T) {
	m := started(t, "dgxh100")
	d0, d1 := device(t, m, 0), device(t, m, 1)
	supported := get(d0.GetSupportedEventTypes()).must(t, "GetSupportedEventTypes")
	health := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError)
	if supported&health != health {
		t.Fatalf("supported events %#x lack %#x", supported, health)
	}
	set := get(m.EventSetCreate()).must(t, "EventSetCreate")
	if ret := d0.RegisterEvents(health, set); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := d1.RegisterEvents(nvml.EventTypeAll, set); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Fatalf("RegisterEvents with unsupported types: %v", ret)
	}

	start := time.Now()
	if _, ret := set.Wait(50); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("Wait with no event: %v, want ERROR_TIMEOUT", ret)
	}
	if waited := time.Since(start); waited < 40*time.Millisecond {
		t.Fatalf("Wait(50) returned after %v", waited)
	}

	m.InjectEvent(1, nvml.EventTypeXidCriticalError, 48) // GPU 1 is not registered
	m.InjectEvent(0, nvml.EventTypePState, 0)            // not registered for P-state
	var wg sync.WaitGroup
	wg.Add(1)
	var ev nvml.EventData
	var ret nvml.Return
	go func() {
		defer wg.Done()
		ev, ret = set.Wait(5000)
	}()
	time.Sleep(20 * time.Millisecond)
	m.InjectEvent(0, nvml.EventTypeXidCriticalError, 48)
	wg.Wait()
	if ret != nvml.SUCCESS || ev.EventType != nvml.EventTypeXidCriticalError || ev.EventData != 48 || ev.Device != d0 ||
		ev.GpuInstanceId != 0xFFFFFFFF || ev.ComputeInstanceId != 0xFFFFFFFF {
		t.Fatalf("Wait = %+v, %v; want XID 48 on GPU 0", ev, ret)
	}
	if _, ret := set.Wait(0); ret != nvml.ERROR_TIMEOUT {
		t.Fatalf("events for unregistered GPUs or types were delivered: %v", ret)
	}

	m.InjectEvent(0, nvml.EventTypeDoubleBitEccError, 0)
	m.InjectMigEvent(0, 7, 0, nvml.EventTypeXidCriticalError, 31)
	if ev := get(set.Wait(100)).must(t, "Wait"); ev.EventType != nvml.EventTypeDoubleBitEccError {
		t.Fatalf("second event %+v", ev)
	}
	if ev := get(set.Wait(100)).must(t, "Wait"); ev.EventData != 31 || ev.GpuInstanceId != 7 || ev.ComputeInstanceId != 0 {
		t.Fatalf("MIG event %+v", ev)
	}
	if n := get(d0.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)).must(t, "ECC"); n != 1 {
		t.Fatalf("uncorrected ECC errors %d, want 1", n)
	}

	if ret := set.Free(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := set.Wait(0); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Fatalf("Wait on a freed set: %v", ret)
	}
	m.InjectEvent(0, nvml.EventTypeXidCriticalError, 13) // no registered set: dropped
}

// TestHang: while hung, Interface calls, handle calls and event waits block
// (without holding the machine lock: the machine's own methods still
// work), and all of them go on after Release.
func TestHang(t *testing.T) {
	m := started(t, "dgxh100")
	d := device(t, m, 0)
	set, ret := m.EventSetCreate()
	if ret != nvml.SUCCESS {
		t.Fatalf("EventSetCreate: %v", ret)
	}
	m.Hang()
	m.Hang() // idempotent
	calls := map[string]func() nvml.Return{
		"DeviceGetCount":   func() nvml.Return { _, r := m.DeviceGetCount(); return r },
		"Device.GetUUID":   func() nvml.Return { _, r := d.GetUUID(); return r },
		"EventSet.Wait":    func() nvml.Return { _, r := set.Wait(1); return r },
		"DeviceGetUUID(d)": func() nvml.Return { _, r := m.DeviceGetUUID(d); return r },
	}
	var wg sync.WaitGroup
	returned := make(chan string, len(calls))
	for name, call := range calls {
		wg.Add(1)
		go func() { defer wg.Done(); call(); returned <- name }()
	}
	time.Sleep(50 * time.Millisecond)
	select {
	case name := <-returned:
		t.Fatalf("%s returned while NVML hangs", name)
	default:
	}
	if m.GPUCount() == 0 || !m.Hung() {
		t.Fatal("the machine's own methods must work while NVML hangs")
	}
	m.Release()
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(5 * time.Second):
		t.Fatal("calls still blocked after Release")
	}
	if m.Hung() {
		t.Error("Hung after Release")
	}
	m.Release() // idempotent
}
