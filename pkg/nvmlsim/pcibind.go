package nvmlsim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// PCI driver binding and IOMMU groups, as the Linux kernel shows them in sysfs:
//
//	bus/pci/devices/<bdf>/driver -> ../../../../bus/pci/drivers/<driver>  (absent while unbound)
//	bus/pci/devices/<bdf>/driver_override                                 (plain, writable)
//	bus/pci/devices/<bdf>/iommu_group -> ../../../../kernel/iommu_groups/<n>
//	bus/pci/drivers/<driver>/<bdf> -> ../../../../devices/.../<bdf>       (while bound)
//	bus/pci/drivers/{nvidia,vfio-pci}/{bind,unbind}                       (write-only)
//	kernel/iommu_groups/<n>/devices/<bdf> -> ../../../../devices/.../<bdf>
//
// and, in the driver roots, dev/vfio/vfio (always) and dev/vfio/<n> (while a device of group n is
// bound to vfio-pci), device nodes like the others (1:3).
//
// A simulated sysfs is plain files, so the kernel's reaction to a write to bind or unbind is the
// simulation's: those four attributes are named pipes, and ServeSysfs reads what is written to
// them and moves the device as the kernel would (driver_override decides which driver may bind, as
// pci_match_device does). Code under test writes and reads sysfs exactly as on a host; the one
// difference is that the move happens just after the write returns rather than before, so code
// must read the driver link back until it shows the result (which on a host it does at once).
// A GPU that is not bound to nvidia is absent from NVML, as on hardware: DeviceGetCount does not
// count it, the other GPUs' indexes close up, lookups by UUID, PCI bus ID and serial answer
// ERROR_NOT_FOUND, and handles obtained before answer ERROR_NOT_FOUND. It is back after a bind to
// nvidia, with its MIG mode (instances do not survive the driver's unbind).

// PCI driver names.
const (
	DriverNVIDIA = "nvidia"
	DriverVFIO   = "vfio-pci"
)

var pciDrivers = []string{DriverNVIDIA, DriverVFIO}

// IOMMUGroup returns the IOMMU group of GPU index (each GPU is alone in its group), -1 for an
// unknown GPU.
func (m *Machine) IOMMUGroup(index int) int {
	if index < 0 || index >= len(m.gpus) {
		return -1
	}
	return m.gpus[index].iommuGroup()
}

// GPUDriver returns the PCI driver GPU index is bound to ("" while unbound).
func (m *Machine) GPUDriver(index int) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if index < 0 || index >= len(m.gpus) {
		return ""
	}
	return m.gpus[index].driver
}

// iommuGroup numbers groups after the GPU's bus, so that they differ within a machine.
func (g *gpu) iommuGroup() int {
	return int(g.m.spec.buses[g.index])
}

// inNVML reports whether NVML sees g: only GPUs bound to the nvidia driver. m.mu must be held.
func (g *gpu) inNVML() bool {
	return g.driver == DriverNVIDIA
}

// nvmlGPUs are the GPUs NVML enumerates, in index order. m.mu must be held.
func (m *Machine) nvmlGPUs() []*gpu {
	out := make([]*gpu, 0, len(m.gpus))
	for _, g := range m.gpus {
		if g.inNVML() {
			out = append(out, g)
		}
	}
	return out
}

// nvmlIndex is g's NVML index: its place among the GPUs NVML enumerates. m.mu must be held.
func (g *gpu) nvmlIndex() int {
	n := 0
	for _, o := range g.m.gpus[:g.index] {
		if o.inNVML() {
			n++
		}
	}
	return n
}

// pciDeviceDirs are the sysfs device directories of the GPUs, relative to the sysfs root, by GPU
// index: devices/pci<domain>:<root>/<domain>:<root>:<port>.0/<bdf>.
func (m *Machine) pciDeviceDirs() []string {
	ports := map[uint32]int{} // next root-port device number per root complex
	dirs := make([]string, len(m.gpus))
	for i, g := range m.gpus {
		rootBus := m.spec.roots[i]
		ports[rootBus]++
		port := fmt.Sprintf("0000:%02x:%02x.0", rootBus, ports[rootBus])
		dirs[i] = filepath.Join("devices", fmt.Sprintf("pci0000:%02x", rootBus), port, g.busID())
	}
	return dirs
}

// up4 climbs from a device directory (or a drivers/<d> or iommu_groups/<n>/devices directory) to
// the sysfs root: every one of them is four levels deep.
const up4 = "../../../.."

// writeBinding writes the binding and IOMMU parts of root for every GPU. A device directory that
// existed before (fresh is false) with a driver_override keeps its driver link and
// driver_override: they are the simulated kernel's state, and the machine adopts them. m.mu must
// be held.
func (m *Machine) writeBinding(root string, dirs []string, fresh []bool) error {
	for _, d := range pciDrivers {
		for _, attr := range []string{"bind", "unbind"} {
			if err := mkfifo(filepath.Join(root, "bus/pci/drivers", d, attr)); err != nil {
				return err
			}
		}
	}
	for i, g := range m.gpus {
		dev := filepath.Join(root, dirs[i])
		group := filepath.Join("kernel/iommu_groups", fmt.Sprint(g.iommuGroup()))
		if err := symlink(filepath.Join(up4, group), filepath.Join(dev, "iommu_group")); err != nil {
			return err
		}
		if err := symlink(filepath.Join(up4, dirs[i]), filepath.Join(root, group, "devices", g.busID())); err != nil {
			return err
		}
		// A tree written before the simulation had binding (no
		// driver_override) starts as a fresh one: every GPU on nvidia.
		override := filepath.Join(dev, "driver_override")
		_, err := os.Lstat(override)
		known := !fresh[i] && err == nil
		if !known {
			if err := writeFile(override, "(null)\n", 0o644); err != nil {
				return err
			}
		}
		if known {
			target, err := os.Readlink(filepath.Join(dev, "driver"))
			switch {
			case err == nil:
				g.driver = filepath.Base(target)
			case errors.Is(err, fs.ErrNotExist):
				g.driver = ""
			default:
				return err
			}
		}
		if err := m.linkDriver(root, dirs[i], g); err != nil {
			return err
		}
	}
	return nil
}

// linkDriver makes root's links show g bound to g.driver (or unbound). m.mu must be held.
func (m *Machine) linkDriver(root, dir string, g *gpu) error {
	for _, d := range pciDrivers {
		link := filepath.Join(root, "bus/pci/drivers", d, g.busID())
		if d == g.driver {
			if err := symlink(filepath.Join(up4, dir), link); err != nil {
				return err
			}
		} else if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	driver := filepath.Join(root, dir, "driver")
	if g.driver == "" {
		if err := os.Remove(driver); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	return symlink(filepath.Join(up4, "bus/pci/drivers", g.driver), driver)
}

// mkfifo makes path a named pipe writable by its owner only, like the kernel's write-only
// attributes, unless it already is one.
func mkfifo(path string) error {
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&fs.ModeNamedPipe != 0 {
			return nil
		}
		if err := os.Remove(path); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := syscall.Mkfifo(path, 0o200); err != nil {
		return fmt.Errorf("mkfifo %s: %w", path, err)
	}
	return os.Chmod(path, 0o200) // mkfifo applies the umask
}

// vfioNodes makes dev/vfio/vfio and dev/vfio/<group> of the GPUs bound to vfio-pci, and removes the
// group nodes of the others. m.mu must be held.
func (m *Machine) vfioNodes(root string) error {
	if err := m.makeDeviceNode(root, "vfio/vfio", 0o666); err != nil {
		return err
	}
	for _, g := range m.gpus {
		name := fmt.Sprintf("vfio/%d", g.iommuGroup())
		if g.driver == DriverVFIO {
			if err := m.makeDeviceNode(root, name, 0o600); err != nil {
				return err
			}
			continue
		}
		if err := os.Remove(filepath.Join(root, "dev", name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// notInNVML fails calls on handles of a GPU NVML no longer enumerates.
func notInNVML(g *gpu) (nvml.Return, bool) {
	if !g.inNVML() {
		return nvml.ERROR_NOT_FOUND, true
	}
	return nvml.SUCCESS, false
}

// bindOp is the kernel's handling of a write of bdf to bus/pci/drivers/<driver>/<attr> under root. Like the
// kernel it ignores (the write would fail with ENODEV or EBUSY) a bind of a device that has a
// driver or that the driver does not match, and an unbind from a driver the device is not bound to.
func (m *Machine) bindOp(root, driver, attr, bdf string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var g *gpu
	for _, o := range m.gpus {
		if strings.EqualFold(o.busID(), bdf) {
			g = o
		}
	}
	if g == nil {
		return
	}
	dirs := m.pciDeviceDirs()
	// The tree is the kernel's state: another process's machine (a plugin
	// handing over to its successor) may have moved the device since this
	// machine last looked.
	if target, err := os.Readlink(filepath.Join(root, dirs[g.index], "driver")); err == nil {
		g.driver = filepath.Base(target)
	} else if errors.Is(err, fs.ErrNotExist) {
		g.driver = ""
	}
	switch attr {
	case "unbind":
		if g.driver != driver {
			return
		}
		if driver == DriverNVIDIA {
			g.gpuInstances = map[uint32]*gpuInstance{} // the driver's teardown destroys them
			_ = m.commitErr(func() {})
		}
		g.driver = ""
	case "bind":
		if g.driver != "" || !matches(root, driver, dirs[g.index]) {
			return
		}
		g.driver = driver
	}
	// The device nodes first: the kernel makes (or removes) /dev/vfio/<group> while it binds
	// (unbinds) the device, before the driver link shows the result.
	m.refreshDriverRoots()
	for _, root := range m.sysfsRoots {
		_ = m.linkDriver(root, dirs[g.index], g)
	}
}

// matches is pci_match_device for the two drivers: a driver_override names the only driver that
// may bind; without one, nvidia matches its GPUs by ID and vfio-pci (no ID table) matches nothing.
// The override is read under root, the tree the bind was written to.
func matches(root, driver, dir string) bool {
	b, err := os.ReadFile(filepath.Join(root, dir, "driver_override"))
	if err != nil {
		return false
	}
	override := strings.TrimSpace(string(b))
	if override != "" && override != "(null)" {
		return override == driver
	}
	return driver == DriverNVIDIA
}

// resetBinding is a reboot's effect: every GPU bound to nvidia, no override. m.mu must be held.
func (m *Machine) resetBinding() {
	dirs := m.pciDeviceDirs()
	for i, g := range m.gpus {
		g.driver = DriverNVIDIA
		for _, root := range m.sysfsRoots {
			_ = writeFile(filepath.Join(root, dirs[i], "driver_override"), "(null)\n", 0o644)
			_ = m.linkDriver(root, dirs[i], g)
		}
	}
}
