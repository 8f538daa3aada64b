package passthrough

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// simulated returns an initialized machine with a served sysfs and the sysfs root.
func simulated(t *testing.T, machine string) (*nvmlsim.Machine, Sysfs, string) {
	t.Helper()
	m, err := nvmlsim.New(machine)
	if err != nil {
		t.Fatal(err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	t.Cleanup(func() { m.Shutdown() })
	root, driverRoot := t.TempDir(), t.TempDir()
	if err := m.WriteDriverRoot(driverRoot); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteSysfs(root); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := m.ServeSysfs(ctx, root); err != nil {
		t.Fatal(err)
	}
	return m, Sysfs{Root: root, Timeout: 5 * time.Second}, driverRoot
}

func busID(t *testing.T, m *nvmlsim.Machine, index int) string {
	t.Helper()
	dev, ret := m.DeviceGetHandleByUUID(m.GPUUUID(index))
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	var b []byte
	for _, c := range pci.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return strings.ToLower(string(b[4:]))
}

func override(t *testing.T, s Sysfs, bdf string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.device(bdf), "driver_override"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestRoundTrip(t *testing.T) {
	ctx := context.Background()
	m, s, driverRoot := simulated(t, "dgxh100")
	bdf := busID(t, m, 3)
	group, err := s.IOMMUGroup(bdf)
	if err != nil || group != m.IOMMUGroup(3) {
		t.Fatalf("IOMMUGroup = %d, %v; want %d", group, err, m.IOMMUGroup(3))
	}
	if devs, err := s.GroupDevices(group); err != nil || len(devs) != 1 || devs[0] != bdf {
		t.Fatalf("GroupDevices = %v, %v; want [%s]", devs, err, bdf)
	}
	for range 2 { // idempotent
		if err := s.ToVFIO(ctx, bdf); err != nil {
			t.Fatal(err)
		}
		if d, _ := s.Driver(bdf); d != DriverVFIO {
			t.Fatalf("after ToVFIO bound to %q", d)
		}
	}
	if _, ret := m.DeviceGetHandleByUUID(m.GPUUUID(3)); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("NVML still finds the GPU on vfio-pci: %v", ret)
	}
	if _, err := os.Stat(filepath.Join(driverRoot, "dev/vfio", strconv.Itoa(group))); err != nil {
		t.Errorf("VFIO group node: %v", err)
	}
	for range 2 {
		if err := s.ToNVIDIA(ctx, bdf); err != nil {
			t.Fatal(err)
		}
		if d, _ := s.Driver(bdf); d != DriverNVIDIA {
			t.Fatalf("after ToNVIDIA bound to %q", d)
		}
	}
	if o := override(t, s, bdf); o != "" {
		t.Errorf("driver_override %q left after ToNVIDIA", o)
	}
	if _, ret := m.DeviceGetHandleByUUID(m.GPUUUID(3)); ret != nvml.SUCCESS {
		t.Errorf("NVML does not find the GPU back on nvidia: %v", ret)
	}
}

// A crash can stop a move after any of its writes; the next call, in either direction,
// finishes from there.
func TestResumeAfterEachStep(t *testing.T) {
	ctx := context.Background()
	steps := map[string]func(t *testing.T, s Sysfs, bdf string){
		"override set": func(t *testing.T, s Sysfs, bdf string) {
			must(t, writeAttr(filepath.Join(s.device(bdf), "driver_override"), DriverVFIO))
		},
		"unbound from nvidia": func(t *testing.T, s Sysfs, bdf string) {
			must(t, writeAttr(filepath.Join(s.device(bdf), "driver_override"), DriverVFIO))
			must(t, writeAttr(filepath.Join(s.root(), "bus/pci/drivers/nvidia/unbind"), bdf))
			must(t, s.await(ctx, bdf, ""))
		},
		"bound to vfio-pci": func(t *testing.T, s Sysfs, bdf string) {
			must(t, s.ToVFIO(ctx, bdf))
		},
		"back: override cleared": func(t *testing.T, s Sysfs, bdf string) {
			must(t, s.ToVFIO(ctx, bdf))
			must(t, writeAttr(filepath.Join(s.device(bdf), "driver_override"), ""))
		},
		"back: unbound from vfio-pci": func(t *testing.T, s Sysfs, bdf string) {
			must(t, s.ToVFIO(ctx, bdf))
			must(t, writeAttr(filepath.Join(s.device(bdf), "driver_override"), ""))
			must(t, writeAttr(filepath.Join(s.root(), "bus/pci/drivers/vfio-pci/unbind"), bdf))
			must(t, s.await(ctx, bdf, ""))
		},
	}
	for name, crashAfter := range steps {
		for _, to := range []string{DriverVFIO, DriverNVIDIA} {
			t.Run(name+"/then to "+to, func(t *testing.T) {
				m, s, _ := simulated(t, "l4x4")
				bdf := busID(t, m, 1)
				crashAfter(t, s, bdf)
				move := s.ToNVIDIA
				if to == DriverVFIO {
					move = s.ToVFIO
				}
				if err := move(ctx, bdf); err != nil {
					t.Fatal(err)
				}
				if d, _ := s.Driver(bdf); d != to {
					t.Fatalf("bound to %q, want %q", d, to)
				}
			})
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestErrors(t *testing.T) {
	ctx := context.Background()
	m, s, _ := simulated(t, "l4x4")
	if _, err := s.Driver("../../etc"); err == nil || !strings.Contains(err.Error(), "not a PCI address") {
		t.Errorf("Driver(../../etc) = %v, want a refusal", err)
	}
	if err := s.ToVFIO(ctx, "0000:ff:00.0"); err == nil || !strings.Contains(err.Error(), "0000:ff:00.0") {
		t.Errorf("ToVFIO(absent device) = %v, want an error naming it", err)
	}

	// Nobody serves the simulated attributes: the write fails instead of hanging.
	m2, err := nvmlsim.New("l4x4")
	must(t, err)
	root := t.TempDir()
	must(t, m2.WriteSysfs(root))
	unserved := Sysfs{Root: root, Timeout: time.Second}
	err = unserved.ToVFIO(ctx, busID(t, m, 0))
	if !errors.Is(err, syscall.ENXIO) || !strings.Contains(err.Error(), "unbind PCI device") {
		t.Errorf("ToVFIO without a kernel = %v, want ENXIO from unbind", err)
	}
}

func TestInUse(t *testing.T) {
	m, _, _ := simulated(t, "dgxh100")
	uuid := m.GPUUUID(0)
	must(t, InUse(m, uuid))

	unregister, err := m.RegisterProcess(4242, nvmlsim.Registration{Devices: []string{uuid}, SMPercent: 10, MemoryBytes: 1 << 20})
	must(t, err)
	if err := InUse(m, uuid); err == nil || !strings.Contains(err.Error(), "processes 4242") {
		t.Errorf("InUse with a process = %v, want one naming PID 4242", err)
	}
	unregister()
	must(t, InUse(m, uuid))

	dev, _ := m.DeviceGetHandleByUUID(uuid)
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	must(t, InUse(m, uuid)) // MIG mode alone is no use
	info, ret := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	gi, ret := dev.CreateGpuInstance(&info)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := InUse(m, uuid); err == nil || !strings.Contains(err.Error(), "MIG devices MIG-") {
		t.Errorf("InUse with a MIG device = %v, want one naming it", err)
	}
}
