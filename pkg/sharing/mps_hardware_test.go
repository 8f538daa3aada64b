package sharing

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// recordingComputeModes reports DEFAULT and records what would be set, so
// that a test on real hardware leaves the GPU's compute mode alone.
type recordingComputeModes struct {
	mu  sync.Mutex
	set []nvml.ComputeMode
}

func (r *recordingComputeModes) ComputeMode(context.Context, string) (nvml.ComputeMode, error) {
	return nvml.COMPUTEMODE_DEFAULT, nil
}

func (r *recordingComputeModes) SetComputeMode(_ context.Context, _ string, mode nvml.ComputeMode) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set = append(r.set, mode)
	return nil
}

// TestMPSRealControlDaemon runs the MPS lifecycle against the real
// nvidia-cuda-mps-control on a node with a GPU. It runs only when
// SHARING_MPS_CONTROL names the binary and SHARING_GPU_UUID a GPU (or MIG
// device) UUID. It does not change the GPU's compute mode.
func TestMPSRealControlDaemon(t *testing.T) {
	control, uuid := os.Getenv("SHARING_MPS_CONTROL"), os.Getenv("SHARING_GPU_UUID")
	if control == "" || uuid == "" {
		t.Skip("set SHARING_MPS_CONTROL and SHARING_GPU_UUID to run against a real MPS control daemon")
	}
	dir, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	modes := &recordingComputeModes{}
	opts := MPSOptions{Dir: dir, ControlBinary: control, ComputeModes: modes}
	mgr, err := NewMPSManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	dev := DeviceRef{UUID: uuid}
	if strings.HasPrefix(uuid, "MIG-") {
		dev.ParentUUID = "GPU-unknown"
	}
	cfg := &gpuv1beta1.MPSConfig{DefaultActiveThreadPercentage: ptrTo(50), DefaultPinnedDeviceMemoryLimit: quantity("1Gi")}
	if _, err := mgr.Acquire(ctx, dev, MPSShare{ID: "a", Config: cfg}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	p := mgr.paths(uuid)
	pid, running, responsive := mgr.daemonStatus(p, 0)
	if !responsive {
		t.Fatalf("daemon pid %d running %v responsive %v", pid, running, responsive)
	}
	for _, cmd := range []string{"get_default_active_thread_percentage", "get_default_device_pinned_mem_limit " + uuid, "get_default_device_pinned_mem_limit 0", "get_server_list"} {
		out, err := mgr.control(ctx, p, cmd)
		t.Logf("%s -> %q, %v", cmd, out, err)
	}
	out, err := mgr.control(ctx, p, "no_such_command")
	t.Logf("no_such_command -> %q, %v", out, err)
	entries, _ := os.ReadDir(p.pipe)
	for _, e := range entries {
		t.Logf("pipe directory: %s", e.Name())
	}

	// A restarted plugin adopts the daemon.
	mgr2, err := NewMPSManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr2.Reconcile(ctx, []ShareRef{{Device: dev, ID: "a"}}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if pid2, _, _ := mgr2.daemonStatus(p, 0); pid2 != pid {
		t.Errorf("daemon %d replaced by %d; want it adopted", pid, pid2)
	}
	if err := mgr2.Release(ctx, dev, "a"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if processRunning(pid) {
		t.Errorf("daemon %d runs after the last share", pid)
	}
	data, _ := os.ReadFile(p.log + "/control.log")
	t.Logf("control.log:\n%s", data)
	t.Logf("compute modes the manager set: %v", modes.set)
}
