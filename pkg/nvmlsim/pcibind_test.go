package nvmlsim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// writeAttr writes value to a sysfs attribute as a program would on a host.
func writeAttr(t *testing.T, path, value string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	if _, err := f.WriteString(value + "\n"); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

// driverOf reads the driver link of bdf under root ("" while unbound).
func driverOf(root, bdf string) string {
	target, err := os.Readlink(filepath.Join(root, "bus/pci/devices", bdf, "driver"))
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}

// waitDriver waits until bdf's driver link shows want.
func waitDriver(t *testing.T, root, bdf, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for driverOf(root, bdf) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s bound to %q, want %q", bdf, driverOf(root, bdf), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// servedSysfs returns a machine with its sysfs and driver root written and its kernel served.
func servedSysfs(t *testing.T, machine string, opts ...Option) (m *Machine, sys, driverRoot string) {
	t.Helper()
	m = started(t, machine, opts...)
	sys, driverRoot = t.TempDir(), t.TempDir()
	if err := m.WriteDriverRoot(driverRoot); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteSysfs(sys); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := m.ServeSysfs(ctx, sys); err != nil {
		t.Fatal(err)
	}
	return m, sys, driverRoot
}

func TestSysfsBindingLayout(t *testing.T) {
	m, sys, driverRoot := servedSysfs(t, "dgxh100")
	for i := range m.GPUCount() {
		bdf := m.gpus[i].busID()
		dev := filepath.Join(sys, "bus/pci/devices", bdf)
		if got := driverOf(sys, bdf); got != DriverNVIDIA {
			t.Errorf("GPU %d driver %q, want nvidia", i, got)
		}
		group, err := filepath.EvalSymlinks(filepath.Join(dev, "iommu_group"))
		if err != nil || filepath.Base(group) != fmt.Sprint(m.IOMMUGroup(i)) {
			t.Errorf("GPU %d iommu_group -> %q (%v), want group %d", i, group, err, m.IOMMUGroup(i))
		}
		member, err := filepath.EvalSymlinks(filepath.Join(group, "devices", bdf))
		if real, _ := filepath.EvalSymlinks(dev); err != nil || member != real {
			t.Errorf("GPU %d: group lists %q (%v), want %q", i, member, err, real)
		}
		if b, err := os.ReadFile(filepath.Join(dev, "driver_override")); err != nil || string(b) != "(null)\n" {
			t.Errorf("GPU %d driver_override %q (%v), want (null)", i, b, err)
		}
		if _, err := os.Stat(filepath.Join(driverRoot, "dev/vfio", fmt.Sprint(m.IOMMUGroup(i)))); err == nil {
			t.Errorf("GPU %d: dev/vfio/%d exists while bound to nvidia", i, m.IOMMUGroup(i))
		}
	}
	if _, err := os.Stat(filepath.Join(driverRoot, "dev/vfio/vfio")); err != nil {
		t.Errorf("dev/vfio/vfio: %v", err)
	}
}

func TestSysfsBindingMovesGPUOutOfNVML(t *testing.T) {
	m, sys, driverRoot := servedSysfs(t, "dgxh100")
	const moved = 2
	g := m.gpus[moved]
	bdf, uuid := g.busID(), g.uuid
	stale := device(t, m, moved)
	dev := filepath.Join(sys, "bus/pci/devices", bdf)
	drivers := filepath.Join(sys, "bus/pci/drivers")
	vfioNode := filepath.Join(driverRoot, "dev/vfio", fmt.Sprint(m.IOMMUGroup(moved)))

	// Without an override vfio-pci matches nothing: the bind is refused.
	writeAttr(t, filepath.Join(drivers, "nvidia/unbind"), bdf)
	waitDriver(t, sys, bdf, "")
	writeAttr(t, filepath.Join(drivers, "vfio-pci/bind"), bdf)
	time.Sleep(50 * time.Millisecond) // a refusal shows as nothing happening
	if got := driverOf(sys, bdf); got != "" {
		t.Fatalf("vfio-pci bound %s without a driver_override (bound to %q)", bdf, got)
	}

	if err := os.WriteFile(filepath.Join(dev, "driver_override"), []byte("vfio-pci\n"), 0); err != nil {
		t.Fatal(err)
	}
	writeAttr(t, filepath.Join(drivers, "nvidia/unbind"), bdf)
	waitDriver(t, sys, bdf, "")
	writeAttr(t, filepath.Join(drivers, "vfio-pci/bind"), bdf)
	waitDriver(t, sys, bdf, DriverVFIO)

	if n := get(m.DeviceGetCount()).must(t, "DeviceGetCount"); n != m.GPUCount()-1 {
		t.Errorf("DeviceGetCount = %d with a GPU on vfio-pci, want %d", n, m.GPUCount()-1)
	}
	for i := range m.GPUCount() - 1 {
		if got := get(device(t, m, i).GetUUID()).must(t, "GetUUID"); got == uuid {
			t.Errorf("index %d is the GPU bound to vfio-pci", i)
		}
		if got := get(device(t, m, i).GetIndex()).must(t, "GetIndex"); got != i {
			t.Errorf("GetIndex of index %d = %d", i, got)
		}
	}
	// Machine indexes do not shift: state the simulation keeps per GPU is found by UUID.
	for i := range m.GPUCount() {
		if got := m.GPUIndex(m.GPUUUID(i)); got != i {
			t.Errorf("GPUIndex of GPU %d's UUID = %d with GPU %d on vfio-pci", i, got, moved)
		}
	}
	if got := m.GPUIndex("GPU-unknown"); got != -1 {
		t.Errorf("GPUIndex of an unknown UUID = %d, want -1", got)
	}
	if _, ret := m.DeviceGetHandleByUUID(uuid); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("DeviceGetHandleByUUID of the GPU on vfio-pci: %v, want ERROR_NOT_FOUND", ret)
	}
	if _, ret := m.DeviceGetHandleByPciBusId(bdf); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("DeviceGetHandleByPciBusId of the GPU on vfio-pci: %v, want ERROR_NOT_FOUND", ret)
	}
	if _, ret := stale.GetUUID(); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("old handle's GetUUID: %v, want ERROR_NOT_FOUND", ret)
	}
	if _, err := os.Stat(vfioNode); err != nil {
		t.Errorf("VFIO group node while bound to vfio-pci: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(drivers, "vfio-pci", bdf)); err != nil {
		t.Errorf("vfio-pci does not list the device: %v", err)
	}

	// With the override still set, nvidia may not bind; cleared, it does.
	writeAttr(t, filepath.Join(drivers, "vfio-pci/unbind"), bdf)
	waitDriver(t, sys, bdf, "")
	writeAttr(t, filepath.Join(drivers, "nvidia/bind"), bdf)
	if err := os.WriteFile(filepath.Join(dev, "driver_override"), []byte("\n"), 0); err != nil {
		t.Fatal(err)
	}
	writeAttr(t, filepath.Join(drivers, "nvidia/bind"), bdf)
	waitDriver(t, sys, bdf, DriverNVIDIA)
	if n := get(m.DeviceGetCount()).must(t, "DeviceGetCount"); n != m.GPUCount() {
		t.Errorf("DeviceGetCount = %d after rebinding, want %d", n, m.GPUCount())
	}
	if got := get(device(t, m, moved).GetUUID()).must(t, "GetUUID"); got != uuid {
		t.Errorf("index %d after rebinding is %s, want %s", moved, got, uuid)
	}
	if _, err := os.Stat(vfioNode); err == nil {
		t.Error("VFIO group node left after rebinding to nvidia")
	}
}

// The binding is kernel state: a new process (a restarted plugin) finds it in sysfs, and NVML
// leaves the GPU out from the start; a reboot binds every GPU to nvidia again.
func TestSysfsBindingSurvivesRestartNotReboot(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state.json")
	m, sys, _ := servedSysfs(t, "l4x4", WithStateFile(state))
	bdf := m.gpus[1].busID()
	if err := os.WriteFile(filepath.Join(sys, "bus/pci/devices", bdf, "driver_override"), []byte("vfio-pci\n"), 0); err != nil {
		t.Fatal(err)
	}
	writeAttr(t, filepath.Join(sys, "bus/pci/drivers/nvidia/unbind"), bdf)
	waitDriver(t, sys, bdf, "")
	writeAttr(t, filepath.Join(sys, "bus/pci/drivers/vfio-pci/bind"), bdf)
	waitDriver(t, sys, bdf, DriverVFIO)

	again := started(t, "l4x4", WithStateFile(state))
	if err := again.WriteSysfs(sys); err != nil {
		t.Fatal(err)
	}
	if got := again.GPUDriver(1); got != DriverVFIO {
		t.Errorf("restarted machine: GPU 1 bound to %q, want vfio-pci", got)
	}
	if n := get(again.DeviceGetCount()).must(t, "DeviceGetCount"); n != 3 {
		t.Errorf("restarted machine: DeviceGetCount = %d, want 3", n)
	}
	if err := again.Reboot(); err != nil {
		t.Fatal(err)
	}
	if got := driverOf(sys, bdf); got != DriverNVIDIA {
		t.Errorf("after reboot: bound to %q, want nvidia", got)
	}
	if n := get(again.DeviceGetCount()).must(t, "DeviceGetCount"); n != 4 {
		t.Errorf("after reboot: DeviceGetCount = %d, want 4", n)
	}
}

// A tree an older simulation wrote has no binding: its GPUs start on nvidia, not unbound (a plugin
// upgraded over such a tree must still see every GPU).
func TestSysfsWithoutBindingStartsOnNVIDIA(t *testing.T) {
	m := started(t, "l4x4")
	sys := t.TempDir()
	if err := m.WriteSysfs(sys); err != nil {
		t.Fatal(err)
	}
	for i := range m.GPUCount() {
		dev := filepath.Join(sys, "bus/pci/devices", m.gpus[i].busID())
		if err := os.Remove(filepath.Join(dev, "driver")); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(dev, "driver_override")); err != nil {
			t.Fatal(err)
		}
	}
	again := started(t, "l4x4")
	if err := again.WriteSysfs(sys); err != nil {
		t.Fatal(err)
	}
	if n := get(again.DeviceGetCount()).must(t, "DeviceGetCount"); n != 4 {
		t.Errorf("DeviceGetCount = %d over an old tree, want 4", n)
	}
	if got := driverOf(sys, again.gpus[0].busID()); got != DriverNVIDIA {
		t.Errorf("GPU 0 bound to %q over an old tree, want nvidia", got)
	}
}
