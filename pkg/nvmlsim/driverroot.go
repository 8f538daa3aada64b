package nvmlsim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// Driver root: the files of an NVIDIA driver installation that a container runtime (through CDI
// specs or nvidia-container-toolkit) gives to containers. Device nodes are real character devices
// with the numbers of /dev/null (1:3), so that containers can open them harmlessly.

// nullDev is /dev/null's device number, major 1 minor 3, in Linux's encoding.
const nullDev = 1<<8 | 3

// DeviceNodeStandIn is the device number of every device node of a simulated driver root,
// /dev/null's: a container given a simulated device opens /dev/null, never a real device of
// the host. Code that checks a node's numbers accepts this one in simulation.
const DeviceNodeStandIn uint64 = nullDev

// procDevicesPath is the simulated kernel's list of device majors (the driver's entries
// and a few of Linux's), relative to the driver root.
const procDevicesPath = "proc/devices"

// IMEXChannelsMajor is the major the simulated nvidia module registers its IMEX channel
// devices under in proc/devices; the channel nodes themselves are DeviceNodeStandIn.
const IMEXChannelsMajor = 234

// ProcDevicesFile is the simulated /proc/devices under driver root root.
func ProcDevicesFile(root string) string { return filepath.Join(root, procDevicesPath) }

// procDevices is /proc/devices as a kernel with the nvidia modules loaded lists it.
func procDevices() string {
	return "Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n195 nvidia\n" +
		fmt.Sprintf("%d nvidia-caps-imex-channels\n", IMEXChannelsMajor) +
		"235 nvidia-caps\n510 nvidia-uvm\n\nBlock devices:\n  7 loop\n  8 sd\n259 blkext\n"
}

// migMinorsGPUs is how many GPUs /proc/driver/nvidia-caps/mig-minors always lists (the driver's
// device limit), and the MIG capability minor layout: config 1, monitor 2, then per GPU 15 GPU
// instances of 1 + 8 minors (gi access, then ci0..ci7 access), 135 per GPU. The MIG User Guide
// shows the ends of that file: gpu0/gi0/access 3 and gpu31/gi14/ci7/access 4322.
const (
	migMinorsGPUs   = 32
	migGIsPerGPU    = 15
	migCIsPerGI     = 8
	migMinorsPerGI  = 1 + migCIsPerGI
	migMinorsPerGPU = migGIsPerGPU * migMinorsPerGI
)

// giAccessMinor is the nvidia-caps minor of gpu<gpuMinor>/gi<gi>/access.
func giAccessMinor(gpuMinor, gi int) int {
	return 3 + gpuMinor*migMinorsPerGPU + gi*migMinorsPerGI
}

// ciAccessMinor is the nvidia-caps minor of gpu<gpuMinor>/gi<gi>/ci<ci>/access.
func ciAccessMinor(gpuMinor, gi, ci int) int {
	return giAccessMinor(gpuMinor, gi) + 1 + ci
}

// driverLibraries are the compute and utility libraries of a driver installation, with the
// SONAME link each one has ("" for none).
var driverLibraries = []struct{ name, soname string }{
	{"libcuda.so", "libcuda.so.1"},
	{"libcudadebugger.so", "libcudadebugger.so.1"},
	{"libnvidia-ml.so", "libnvidia-ml.so.1"},
	{"libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"},
	{"libnvidia-nvvm.so", "libnvidia-nvvm.so.4"},
	{"libnvidia-opencl.so", "libnvidia-opencl.so.1"},
	{"libnvidia-cfg.so", "libnvidia-cfg.so.1"},
	{"libnvidia-allocator.so", "libnvidia-allocator.so.1"},
	{"libnvidia-gpucomp.so", ""},
	{"libnvidia-pkcs11.so", ""},
	{"libnvidia-pkcs11-openssl3.so", ""},
}

// driverBinaries are the utility binaries besides nvidia-smi; each is a script that succeeds.
var driverBinaries = []string{
	"nvidia-cuda-mps-control",
	"nvidia-cuda-mps-server",
	"nvidia-debugdump",
	"nvidia-persistenced",
}

// WriteDriverRoot writes a simulated NVIDIA driver installation under root:
//
//	dev/nvidia<minor> per GPU, dev/nvidiactl, dev/nvidia-uvm, dev/nvidia-uvm-tools,
//	dev/nvidia-caps-imex-channels/channel<N> on multi-node NVLink trays (IMEXChannels);
//	dev/nvidia-caps/nvidia-cap1 (MIG config), nvidia-cap2 (monitor) and the capability nodes
//	of the GPU and compute instances that exist (kept up to date as they are created);
//	proc/driver/nvidia-caps/mig-minors (all 32 GPUs, like the driver's),
//	proc/devices with the nvidia-caps-imex-channels major (IMEXChannelsMajor; ProcDevicesFile),
//	proc/driver/nvidia/capabilities/mig/{config,monitor} and gpu<N>/mig/gi<G>[/ci<C>]/access
//	of existing instances, version and gpus/<bdf>/information, in the driver's formats;
//	usr/lib/x86_64-linux-gnu/<library>.so.<driver version> with their SONAME links;
//	lib/firmware/nvidia/<driver version>/gsp_*.bin;
//	usr/bin/nvidia-smi (a POSIX sh script, see nvidiasmi.go) and the other utilities;
//	proc/sys/kernel/random/boot_id, the simulated kernel's boot ID (BootID, changed by Reboot).
//
// Device nodes are character devices 1:3 (/dev/null), made with mknod; only where mknod is not
// permitted (EPERM) are they regular files. WriteDriverRoot is idempotent and leaves unchanged
// files alone. The machine remembers root and keeps its MIG-dependent parts (nvidia-smi's
// listing, capability nodes and files) current as instances are created and destroyed.
func (m *Machine) WriteDriverRoot(root string) error {
	if err := m.writeDriverRoot(root); err != nil {
		return fmt.Errorf("write simulated driver root for %s under %s: %w", m.spec.name, root, err)
	}
	return nil
}

func (m *Machine) writeDriverRoot(root string) error {
	files := map[string]string{
		"proc/driver/nvidia/capabilities/mig/config":  capabilityFile(1, 0o400),
		"proc/driver/nvidia/capabilities/mig/monitor": capabilityFile(2, 0o444),
		"proc/driver/nvidia-caps/mig-minors":          migMinors(),
		procDevicesPath:                               procDevices(),
		"proc/driver/nvidia/version": fmt.Sprintf("NVRM version: NVIDIA UNIX x86_64 Kernel Module  %s  (simulated by nvmlsim)\n"+
			"GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n", m.driverVersion),
	}
	for _, g := range m.gpus {
		files[filepath.Join("proc/driver/nvidia/gpus", g.busID(), "information")] = g.information()
	}

	libDir := filepath.Join(root, "usr", "lib", "x86_64-linux-gnu")
	for _, lib := range driverLibraries {
		versioned := lib.name + "." + m.driverVersion
		content := fmt.Sprintf("%s: simulated by nvmlsim, not a real library\n", versioned)
		files[filepath.Join("usr/lib/x86_64-linux-gnu", versioned)] = content
		if lib.soname != "" {
			if err := symlink(versioned, filepath.Join(libDir, lib.soname)); err != nil {
				return err
			}
		}
	}
	for _, dev := range []string{"libcuda.so", "libnvidia-ml.so"} {
		if err := symlink(dev+".1", filepath.Join(libDir, dev)); err != nil {
			return err
		}
	}
	for _, fw := range []string{"gsp_ga10x.bin", "gsp_tu10x.bin"} {
		files[filepath.Join("lib/firmware/nvidia", m.driverVersion, fw)] = "simulated GSP firmware (nvmlsim)\n"
	}
	for name, content := range files {
		if err := writeFile(filepath.Join(root, name), content, 0o444); err != nil {
			return err
		}
	}
	for _, bin := range driverBinaries {
		script := fmt.Sprintf("#!/bin/sh\n# %s simulated by nvmlsim: not NVIDIA software.\n"+
			"[ -t 0 ] || cat >/dev/null 2>&1\nexit 0\n", bin)
		if err := writeFile(filepath.Join(root, "usr", "bin", bin), script, 0o755); err != nil {
			return err
		}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.makeDeviceNodes(root); err != nil {
		return err
	}
	if err := m.syncDriverRoot(root); err != nil {
		return err
	}
	if !slices.Contains(m.driverRoots, root) {
		m.driverRoots = append(m.driverRoots, root)
	}
	return nil
}

// refreshDriverRoots brings every driver root written so far up to date after a change of MIG
// state. It is best effort: a failure there is not a failure of the NVML call that changed the
// state. m.mu must be held.
func (m *Machine) refreshDriverRoots() {
	for _, root := range m.driverRoots {
		_ = m.syncDriverRoot(root)
	}
}

// syncDriverRoot writes the parts of a driver root that follow MIG state: nvidia-smi's listing,
// the capability device nodes of existing GPU and compute instances (created on demand and left
// in place, like nvidia-modprobe does) and their /proc/driver/nvidia/capabilities entries (present
// only while the instance exists, like the driver's). m.mu must be held.
func (m *Machine) syncDriverRoot(root string) error {
	if err := m.writeNvidiaSMI(root); err != nil {
		return err
	}
	if err := m.vfioNodes(root); err != nil {
		return err
	}
	// The kernel's boot ID, which Reboot changes; replaced atomically, since the health monitor
	// reads it while the plugin runs.
	bootFile, bootID := filepath.Join(root, bootIDPath), m.bootIDLocked()+"\n"
	if old, err := os.ReadFile(bootFile); err != nil || string(old) != bootID {
		if err := writeFileAtomicMkdir(bootFile, []byte(bootID), 0o444); err != nil {
			return err
		}
	}
	for _, g := range m.gpus {
		if g.spec.mig == nil {
			continue
		}
		capDir := filepath.Join(root, "proc/driver/nvidia/capabilities", fmt.Sprintf("gpu%d", g.index), "mig")
		keep := map[string]bool{}
		for _, gi := range g.sortedGpuInstances() {
			giName := fmt.Sprintf("gi%d", gi.id)
			keep[giName] = true
			minor := giAccessMinor(g.index, int(gi.id))
			if err := m.makeDeviceNode(root, fmt.Sprintf("nvidia-caps/nvidia-cap%d", minor), 0o444); err != nil {
				return err
			}
			if err := writeFile(filepath.Join(capDir, giName, "access"), capabilityFile(minor, 0o444), 0o444); err != nil {
				return err
			}
			for _, ci := range gi.sortedComputeInstances() {
				minor := ciAccessMinor(g.index, int(gi.id), int(ci.id))
				if err := m.makeDeviceNode(root, fmt.Sprintf("nvidia-caps/nvidia-cap%d", minor), 0o444); err != nil {
					return err
				}
				if err := writeFile(filepath.Join(capDir, giName, fmt.Sprintf("ci%d", ci.id), "access"), capabilityFile(minor, 0o444), 0o444); err != nil {
					return err
				}
			}
			if err := removeAllExcept(filepath.Join(capDir, giName), ciNames(gi)); err != nil {
				return err
			}
		}
		if err := removeAllExcept(capDir, keep); err != nil {
			return err
		}
	}
	return nil
}

func ciNames(gi *gpuInstance) map[string]bool {
	names := map[string]bool{"access": true}
	for id := range gi.computeInstances {
		names[fmt.Sprintf("ci%d", id)] = true
	}
	return names
}

// removeAllExcept removes the entries of dir whose names are not in keep.
func removeAllExcept(dir string, keep map[string]bool) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !keep[e.Name()] {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// capabilityFile is the content of a /proc/driver/nvidia/capabilities/... file.
func capabilityFile(minor int, mode os.FileMode) string {
	return fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: %d\nDeviceFileModify: 1\n", minor, mode)
}

// migMinors is /proc/driver/nvidia-caps/mig-minors.
func migMinors() string {
	var b strings.Builder
	b.WriteString("config 1\nmonitor 2\n")
	for gpu := 0; gpu < migMinorsGPUs; gpu++ {
		for gi := 0; gi < migGIsPerGPU; gi++ {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", gpu, gi, giAccessMinor(gpu, gi))
			for ci := 0; ci < migCIsPerGI; ci++ {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", gpu, gi, ci, ciAccessMinor(gpu, gi, ci))
			}
		}
	}
	return b.String()
}

// information is /proc/driver/nvidia/gpus/<bdf>/information.
func (g *gpu) information() string {
	return fmt.Sprintf("Model: \t\t %s\nIRQ:   \t\t %d\nGPU UUID: \t %s\nVideo BIOS: \t %s\n"+
		"Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"+
		"Bus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No\n",
		g.spec.name, 100+g.index, g.uuid, strings.ToLower(g.spec.vbios), g.busID(), g.index)
}

// makeDeviceNode makes path a character device with /dev/null's numbers and the given mode,
// or a regular file where mknod is not permitted.
func makeDeviceNode(path string, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err == nil {
		if st.Mode&syscall.S_IFMT == syscall.S_IFCHR && st.Rdev == nullDev {
			return os.Chmod(path, mode)
		}
		if err := os.Remove(path); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	err := syscall.Mknod(path, syscall.S_IFCHR|uint32(mode), nullDev)
	if errors.Is(err, syscall.EPERM) {
		return writeFile(path, "", mode)
	}
	if err != nil {
		return fmt.Errorf("mknod %s: %w", path, err)
	}
	return os.Chmod(path, mode) // mknod applies the umask
}
