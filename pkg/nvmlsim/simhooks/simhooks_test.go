package simhooks

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

func TestMain(m *testing.M) { os.Exit(simnode.Main(m)) }

// newSim returns an initialized simulated machine.
func newSim(t *testing.T, machine string) *nvmlsim.Machine {
	t.Helper()
	return simnode.New(t, machine, "node-1").Machine
}

// TestTimeSlicer checks the adapter over the simulation.
func TestTimeSlicer(t *testing.T) {
	m := newSim(t, "dgxh100")
	s := NewTimeSlicer(m)
	ctx := context.Background()
	gpu := sharing.DeviceRef{UUID: m.GPUUUID(5), Index: 5}
	migDev := sharing.DeviceRef{UUID: "MIG-9a7c1c4e-7d2b-5f37-a1b0-0c5a3e2f6d15", ParentUUID: m.GPUUUID(5), Index: 5}
	if err := s.SetTimeslice(ctx, gpu, 2); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Timeslice(ctx, gpu); err != nil || got != 2 || m.Timeslice(5) != 2 {
		t.Errorf("Timeslice = %d, %v; simulation %d; want 2", got, err, m.Timeslice(5))
	}
	// The GPU is found by UUID: with GPU 2 bound to vfio-pci NVML numbers GPU 5 as 4, and the
	// level must land on GPU 5 all the same (the campaign leaked a level on GPU 4 when it did not).
	shifted := sharing.DeviceRef{UUID: m.GPUUUID(5), Index: 4}
	if err := s.SetTimeslice(ctx, shifted, 3); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Timeslice(ctx, shifted); err != nil || got != 3 || m.Timeslice(5) != 3 || m.Timeslice(4) != 0 {
		t.Errorf("by UUID: Timeslice = %d, %v; simulation GPU 5 %d, GPU 4 %d; want 3, 3, 0", got, err, m.Timeslice(5), m.Timeslice(4))
	}
	unknown := sharing.DeviceRef{UUID: "GPU-00000000-0000-0000-0000-000000000000", Index: 5}
	if err := s.SetTimeslice(ctx, unknown, 1); err == nil || m.Timeslice(5) != 3 {
		t.Errorf("unknown UUID: %v, GPU 5 level %d; want an error and level 3", err, m.Timeslice(5))
	}
	if err := s.SetTimeslice(ctx, gpu, 7); err == nil || errors.Is(err, sharing.ErrNotSupported) {
		t.Errorf("level 7: %v, want a plain error", err)
	}
	if err := s.SetTimeslice(ctx, migDev, 1); !errors.Is(err, sharing.ErrNotSupported) {
		t.Errorf("MIG device: %v, want ErrNotSupported", err)
	}
	if _, err := s.Timeslice(ctx, migDev); !errors.Is(err, sharing.ErrNotSupported) {
		t.Errorf("Timeslice of a MIG device: %v, want ErrNotSupported", err)
	}
}

// TestEventHandler: the query is checked, and a valid one reaches the
// simulated GPU as NVML reports it (an XID event, a lost GPU).
func TestEventHandler(t *testing.T) {
	for name, tc := range map[string]struct {
		method, query string
		want          int
		xid           uint64 // the critical XID GPU 1's event set receives; 0: none
		lost          bool
	}{
		"xid":            {http.MethodPost, "gpu=1&xid=48", http.StatusOK, 48, false},
		"lost":           {http.MethodPost, "gpu=1&lost=true", http.StatusOK, 79, true},
		"not lost":       {http.MethodPost, "gpu=1&lost=false", http.StatusOK, 0, false},
		"get":            {http.MethodGet, "gpu=1&xid=48", http.StatusMethodNotAllowed, 0, false},
		"no gpu":         {http.MethodPost, "xid=48", http.StatusBadRequest, 0, false},
		"gpu too high":   {http.MethodPost, "gpu=8&xid=48", http.StatusBadRequest, 0, false},
		"negative gpu":   {http.MethodPost, "gpu=-1&xid=48", http.StatusBadRequest, 0, false},
		"xid not number": {http.MethodPost, "gpu=1&xid=x", http.StatusBadRequest, 0, false},
		"no event":       {http.MethodPost, "gpu=1", http.StatusBadRequest, 0, false},
	} {
		t.Run(name, func(t *testing.T) {
			m := newSim(t, "dgxh100")
			dev, ret := m.DeviceGetHandleByIndex(1)
			if ret != nvml.SUCCESS {
				t.Fatalf("DeviceGetHandleByIndex: %v", ret)
			}
			set, ret := m.EventSetCreate()
			if ret != nvml.SUCCESS {
				t.Fatalf("EventSetCreate: %v", ret)
			}
			if ret := dev.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
				t.Fatalf("RegisterEvents: %v", ret)
			}
			rec := httptest.NewRecorder()
			EventHandler(m, nil).ServeHTTP(rec, httptest.NewRequest(tc.method, EventPath+"?"+tc.query, nil))
			if rec.Code != tc.want {
				t.Fatalf("%s %s?%s: %d %q, want %d", tc.method, EventPath, tc.query, rec.Code, rec.Body, tc.want)
			}
			ev, ret := set.Wait(10)
			switch {
			case tc.xid == 0 && ret != nvml.ERROR_TIMEOUT:
				t.Errorf("event %+v (%v), want none", ev, ret)
			case tc.xid != 0 && (ret != nvml.SUCCESS || ev.EventData != tc.xid):
				t.Errorf("event %+v (%v), want XID %d", ev, ret, tc.xid)
			}
			if m.GPULost(1) != tc.lost {
				t.Errorf("GPU 1 lost: %v, want %v", m.GPULost(1), tc.lost)
			}
		})
	}
}

// TestMPSControl: the simulated control program is found only beside the
// executable (here the test binary, which has none beside it).
func TestMPSControl(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	beside := filepath.Join(filepath.Dir(exe), MPSControlProgram)
	if _, err := os.Stat(beside); err == nil {
		t.Skipf("%s exists beside the test binary; cannot check the missing case", beside)
	}
	if got := MPSControl(); got != "" {
		t.Fatalf("MPSControl() = %q with nothing beside %s", got, exe)
	}
	if err := os.WriteFile(beside, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Skipf("cannot write beside the test binary: %v", err)
	}
	defer func() { _ = os.Remove(beside) }()
	if got := MPSControl(); got != beside {
		t.Errorf("MPSControl() = %q, want %q", got, beside)
	}
}

// TestEventHandlerRecovery: an XID sets the recovery action the simulated GPU
// reports, reset=true performs a GPU reset (which a pending reboot outlasts),
// and reboot=true changes the boot ID and clears every action.
func TestEventHandlerRecovery(t *testing.T) {
	m := newSim(t, "dgxh100")
	post := func(query string) {
		t.Helper()
		rec := httptest.NewRecorder()
		EventHandler(m, nil).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, EventPath+"?"+query, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("POST %s?%s: %d %q", EventPath, query, rec.Code, rec.Body)
		}
	}
	steps := []struct {
		query  string
		gpu1   nvml.DeviceGpuRecoveryAction
		gpu2   nvml.DeviceGpuRecoveryAction
		reboot bool
	}{
		{"gpu=1&xid=48", nvml.GPU_RECOVERY_ACTION_GPU_RESET, nvml.GPU_RECOVERY_ACTION_NONE, false},
		{"gpu=2&xid=79", nvml.GPU_RECOVERY_ACTION_GPU_RESET, nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, false},
		{"gpu=1&reset=true", nvml.GPU_RECOVERY_ACTION_NONE, nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, false},
		{"gpu=2&reset=true", nvml.GPU_RECOVERY_ACTION_NONE, nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, false},
		{"reboot=true", nvml.GPU_RECOVERY_ACTION_NONE, nvml.GPU_RECOVERY_ACTION_NONE, true},
	}
	for _, s := range steps {
		boot := m.BootID()
		post(s.query)
		if got1, got2 := m.RecoveryAction(1), m.RecoveryAction(2); got1 != s.gpu1 || got2 != s.gpu2 {
			t.Errorf("after %s: recovery actions %d, %d; want %d, %d", s.query, got1, got2, s.gpu1, s.gpu2)
		}
		if rebooted := m.BootID() != boot; rebooted != s.reboot {
			t.Errorf("after %s: boot ID changed %v, want %v", s.query, rebooted, s.reboot)
		}
	}
}

// TestEventHandlerHang: hang=true blocks NVML calls until hang=false, with
// no GPU named; another value is refused.
func TestEventHandlerHang(t *testing.T) {
	m := newSim(t, "dgxh100")
	post := func(query string) int {
		rec := httptest.NewRecorder()
		EventHandler(m, nil).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, EventPath+"?"+query, nil))
		return rec.Code
	}
	if code := post("hang=maybe"); code != http.StatusBadRequest || m.Hung() {
		t.Fatalf("hang=maybe: %d, hung %v; want 400, not hung", code, m.Hung())
	}
	if code := post("hang=true"); code != http.StatusOK || !m.Hung() {
		t.Fatalf("hang=true: %d, hung %v; want 200, hung", code, m.Hung())
	}
	done := make(chan nvml.Return, 1)
	go func() { _, ret := m.DeviceGetCount(); done <- ret }()
	select {
	case ret := <-done:
		t.Fatalf("DeviceGetCount returned %v while NVML hangs", ret)
	case <-time.After(50 * time.Millisecond):
	}
	if code := post("hang=false"); code != http.StatusOK || m.Hung() {
		t.Fatalf("hang=false: %d, hung %v; want 200, not hung", code, m.Hung())
	}
	select {
	case ret := <-done:
		if ret != nvml.SUCCESS {
			t.Errorf("DeviceGetCount after release: %v", ret)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("DeviceGetCount still blocked after hang=false")
	}
}
