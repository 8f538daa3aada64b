package nvmlsim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// WriteSysfs writes, under root, the part of a sysfs tree that describes the machine's GPUs
// and NUMA topology, so that code reading /sys (such as
// k8s.io/dynamic-resource-allocation/deviceattribute with WithFSFromRoot(root)) resolves each
// GPU's PCIe root and NUMA node:
//
//	bus/pci/devices/<bdf> -> ../../../devices/pci<domain>:<root>/<domain>:<root>:<port>.0/<bdf>
//	devices/pci.../<bdf>/{numa_node,vendor,device,class,subsystem_vendor,subsystem_device,local_cpulist}
//	devices/system/node/{online,possible,node<N>/{cpulist,distance}}
//	devices/system/cpu/{online,possible,cpu<X>/{node<N> -> ../../node/node<N>,topology/physical_package_id}}
//
// and the PCI driver binding and IOMMU groups of the GPUs (pcibind.go; ServeSysfs runs the
// kernel side of binding). It is idempotent: files are rewritten and links replaced, except the
// binding state (driver link, driver_override) of a device directory that already existed, which
// the machine adopts, as a restarted process finds the kernel's state.
func (m *Machine) WriteSysfs(root string) error {
	if err := m.writeSysfs(root); err != nil {
		return fmt.Errorf("write simulated sysfs for %s under %s: %w", m.spec.name, root, err)
	}
	return nil
}

func (m *Machine) writeSysfs(root string) error {
	spec := m.spec
	files := map[string]string{}
	links := map[string]string{}
	dirs := m.pciDeviceDirs()
	fresh := make([]bool, len(dirs))
	for i, g := range m.gpus {
		bdf := g.busID()
		dev := dirs[i]
		_, err := os.Lstat(filepath.Join(root, dev))
		fresh[i] = errors.Is(err, fs.ErrNotExist)
		node := g.numaNode()
		files[filepath.Join(dev, "numa_node")] = fmt.Sprintf("%d\n", node)
		files[filepath.Join(dev, "vendor")] = fmt.Sprintf("0x%04x\n", g.spec.pciDeviceID&0xffff)
		files[filepath.Join(dev, "device")] = fmt.Sprintf("0x%04x\n", g.spec.pciDeviceID>>16)
		files[filepath.Join(dev, "subsystem_vendor")] = fmt.Sprintf("0x%04x\n", g.spec.pciSubsystemID&0xffff)
		files[filepath.Join(dev, "subsystem_device")] = fmt.Sprintf("0x%04x\n", g.spec.pciSubsystemID>>16)
		files[filepath.Join(dev, "class")] = "0x030200\n" // 3D controller
		files[filepath.Join(dev, "local_cpulist")] = spec.nodeCPUs[node] + "\n"
		links[filepath.Join("bus", "pci", "devices", bdf)] = filepath.Join("..", "..", "..", dev)
	}

	nodes := len(spec.nodeCPUs)
	online := fmt.Sprintf("0-%d\n", nodes-1)
	files[filepath.Join("devices", "system", "node", "online")] = online
	files[filepath.Join("devices", "system", "node", "possible")] = online
	cpus := fmt.Sprintf("0-%d\n", spec.cpus-1)
	files[filepath.Join("devices", "system", "cpu", "online")] = cpus
	files[filepath.Join("devices", "system", "cpu", "possible")] = cpus
	for n, list := range spec.nodeCPUs {
		nodeDir := filepath.Join("devices", "system", "node", fmt.Sprintf("node%d", n))
		files[filepath.Join(nodeDir, "cpulist")] = list + "\n"
		// ACPI SLIT distances of a two-socket machine: 10 local, 20 remote.
		dist := make([]string, nodes)
		for k := range dist {
			dist[k] = "20"
			if k == n {
				dist[k] = "10"
			}
		}
		files[filepath.Join(nodeDir, "distance")] = strings.Join(dist, " ") + "\n"
		cpuList, err := parseCPUList(list)
		if err != nil {
			return fmt.Errorf("parse cpulist %q of NUMA node %d: %w", list, n, err)
		}
		for _, cpu := range cpuList {
			cpuDir := filepath.Join("devices", "system", "cpu", fmt.Sprintf("cpu%d", cpu))
			// One socket per NUMA node.
			files[filepath.Join(cpuDir, "topology", "physical_package_id")] = fmt.Sprintf("%d\n", n)
			links[filepath.Join(cpuDir, fmt.Sprintf("node%d", n))] = filepath.Join("..", "..", "node", fmt.Sprintf("node%d", n))
		}
	}

	for name, content := range files {
		if err := writeFile(filepath.Join(root, name), content, 0o444); err != nil {
			return err
		}
	}
	for name, target := range links {
		if err := symlink(target, filepath.Join(root, name)); err != nil {
			return err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.writeBinding(root, dirs, fresh); err != nil {
		return err
	}
	m.addSysfsRoot(root)
	m.refreshDriverRoots()
	return nil
}

// writeFile writes content to path, creating parent directories and replacing a read-only file.
// A file that already has that content and mode is left alone.
func writeFile(path, content string, perm os.FileMode) error {
	if st, err := os.Lstat(path); err == nil && st.Mode().IsRegular() && st.Mode().Perm() == perm &&
		st.Size() == int64(len(content)) {
		if old, err := os.ReadFile(path); err == nil && string(old) == content {
			return nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.WriteFile(path, []byte(content), perm)
}

// symlink makes path a symbolic link to target, replacing whatever is there.
func symlink(target, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if current, err := os.Readlink(path); err == nil && current == target {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.Symlink(target, path)
}

// parseCPUList parses a sysfs cpulist such as "0-55,112-167".
func parseCPUList(list string) ([]int, error) {
	var cpus []int
	for _, r := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		first, err := strconv.Atoi(lo)
		if err != nil {
			return nil, err
		}
		last := first
		if isRange {
			if last, err = strconv.Atoi(hi); err != nil {
				return nil, err
			}
		}
		for c := first; c <= last; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}
