package health

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/passthrough"
)

// A GPU passed through to a virtual machine leaves NVML: the monitor skips it without calling it
// lost or unhealthy, and watches it again once it is back on nvidia.
func TestPassedThroughGPUIsSkipped(t *testing.T) {
	f := newFixture(t)
	sys := passthrough.Sysfs{Root: t.TempDir(), Timeout: 5 * time.Second}
	if err := f.machine.WriteSysfs(sys.Root); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := f.machine.ServeSysfs(ctx, sys.Root); err != nil {
		t.Fatal(err)
	}
	mon := f.start(t)
	uuid := f.machine.GPUUUID(4)
	dev, _ := f.machine.DeviceGetHandleByUUID(uuid)
	pci, _ := dev.GetPciInfo()
	var b []byte
	for _, c := range pci.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	bdf := strings.ToLower(string(b[4:]))

	if err := sys.ToVFIO(ctx, bdf); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		f.step(t, mon, time.Minute)
		if st := mon.Snapshot()[uuid]; st.Lost || !st.Healthy() {
			t.Fatalf("passed-through GPU: %+v, want healthy and not lost", st)
		}
	}
	if err := sys.ToNVIDIA(ctx, bdf); err != nil {
		t.Fatal(err)
	}
	f.step(t, mon, time.Minute)
	if st := mon.Snapshot()[uuid]; st.Lost || !st.Healthy() {
		t.Fatalf("GPU back on nvidia: %+v", st)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.events) != 0 {
		t.Errorf("health events while passed through: %+v", f.events)
	}
}
