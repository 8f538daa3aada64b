package discovery

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
)

// Options tune discovery.
type Options struct {
	// SysfsRoot is where the kernel's sysfs is mounted ("/sys" when empty).
	// Tests and the simulation point it at a generated tree.
	SysfsRoot string
	// InventoryFile, if set, is read for the GPUs bound to vfio-pci, which
	// NVML does not see (inventory.go); with WriteInventory, the GPUs
	// discovered are recorded there.
	InventoryFile  string
	WriteInventory bool
}

// Discover lists the GPUs behind lib, ordered by minor number. NVML must be
// initialized by the caller. Fields that identify a device (UUID, name,
// minor, PCI bus ID, memory) are required; an NVML error on them fails
// discovery, naming the GPU and the call, except that a lost GPU
// (ERROR_GPU_IS_LOST) is left out, so the others can still be served. Optional facts (multiprocessors,
// NUMA, NVLink) are left empty when the device does not support them.
func Discover(ctx context.Context, lib nvml.Interface, opts Options) ([]GPU, error) {
	logger := klog.FromContext(ctx)
	sysfsRoot := opts.SysfsRoot
	if sysfsRoot == "" {
		sysfsRoot = "/sys"
	}

	driverVersion, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get driver version: %w", ret)
	}
	cudaVersion, ret := lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get CUDA driver version: %w", ret)
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get device count: %w", ret)
	}

	gpus := make([]GPU, 0, count)
	links := make([]nvlinkPeers, 0, count)
	for i := range count {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret == nvml.ERROR_GPU_IS_LOST {
			// One GPU that fell off the bus must not stop the node:
			// the others are served, this one is not published.
			logger.Error(ret, "GPU is lost; leaving it out", "index", i)
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("get handle of GPU %d: %w", i, ret)
		}
		gpu, err := describe(i, dev)
		if errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
			logger.Error(err, "GPU is lost; leaving it out", "index", i)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		gpu.DriverVersion = driverVersion
		gpu.CUDADriverVersion = fmt.Sprintf("%d.%d", cudaVersion/1000, (cudaVersion%1000)/10)
		gpu.NUMANode, gpu.PCIeRoot = topology(ctx, gpu.PCIBusID, sysfsRoot)
		gpu.ClusterUUID, gpu.CliqueID = fabricClique(dev)
		gpu.NVLinkDomain = gpu.CliqueID
		gpus = append(gpus, gpu)
		links = append(links, activeNVLinkPeers(dev))
	}
	assignNVLinkDomains(gpus, links)

	sort.Slice(gpus, func(a, b int) bool { return gpus[a].Minor < gpus[b].Minor })
	if opts.InventoryFile != "" {
		gpus = addPassedThrough(ctx, gpus, opts.InventoryFile, sysfsRoot)
		if opts.WriteInventory {
			if err := writeInventory(opts.InventoryFile, gpus); err != nil {
				return nil, err
			}
		}
	}
	logger.V(2).Info("Discovered GPUs", "count", len(gpus), "driverVersion", driverVersion)
	return gpus, nil
}

func describe(index int, dev nvml.Device) (GPU, error) {
	gpu := GPU{Index: index, NUMANode: -1}
	var ret nvml.Return
	if gpu.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return gpu, fmt.Errorf("get UUID: %w", ret)
	}
	if gpu.ProductName, ret = dev.GetName(); ret != nvml.SUCCESS {
		return gpu, fmt.Errorf("get name of %s: %w", gpu.UUID, ret)
	}
	if gpu.Minor, ret = dev.GetMinorNumber(); ret != nvml.SUCCESS {
		return gpu, fmt.Errorf("get minor number of %s: %w", gpu.UUID, ret)
	}
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return gpu, fmt.Errorf("get PCI info of %s: %w", gpu.UUID, ret)
	}
	gpu.PCIBusID = normalizePCIBusID(int8String(pci.BusId[:]))
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return gpu, fmt.Errorf("get memory info of %s: %w", gpu.UUID, ret)
	}
	gpu.MemoryBytes = mem.Total
	major, minor, ret := dev.GetCudaComputeCapability()
	if ret != nvml.SUCCESS {
		return gpu, fmt.Errorf("get compute capability of %s: %w", gpu.UUID, ret)
	}
	gpu.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)

	brand, ret := dev.GetBrand()
	if ret != nvml.SUCCESS {
		return gpu, fmt.Errorf("get brand of %s: %w", gpu.UUID, ret)
	}
	gpu.Brand = brandName(brand)
	arch, ret := dev.GetArchitecture()
	if ret != nvml.SUCCESS {
		return gpu, fmt.Errorf("get architecture of %s: %w", gpu.UUID, ret)
	}
	gpu.Architecture = architectureName(arch)

	// Attributes are not supported on every GPU and driver; the SM count is
	// then simply not published.
	if attrs, ret := dev.GetAttributes(); ret == nvml.SUCCESS {
		gpu.Multiprocessors = int(attrs.MultiprocessorCount)
	}

	current, pending, ret := dev.GetMigMode()
	switch {
	case ret == nvml.SUCCESS:
		gpu.MIGCapable = true
		gpu.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
		gpu.MIGPendingEnabled = pending == nvml.DEVICE_MIG_ENABLE
		info, err := mig.Describe(dev)
		if err != nil {
			return gpu, fmt.Errorf("describe MIG of %s: %w", gpu.UUID, err)
		}
		gpu.MIG = info
	case errors.Is(ret, nvml.ERROR_NOT_SUPPORTED):
	default:
		return gpu, fmt.Errorf("get MIG mode of %s: %w", gpu.UUID, ret)
	}
	return gpu, nil
}

// topology resolves NUMA node and PCIe root through the standard DRA helpers
// so the attributes match what other drivers publish for the same machine.
func topology(ctx context.Context, pciBusID, sysfsRoot string) (int, string) {
	logger := klog.FromContext(ctx)
	fs := deviceattribute.WithFSFromRoot(sysfsRoot)
	numa := -1
	if attr, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(pciBusID, deviceattribute.ScalarAttribute, fs); err == nil && attr.Value.IntValue != nil {
		numa = int(*attr.Value.IntValue)
	} else if err != nil {
		logger.V(4).Info("No NUMA node for GPU", "pciBusID", pciBusID, "err", err)
	}
	root := ""
	if attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(pciBusID, fs); err == nil && attr.Value.StringValue != nil {
		root = *attr.Value.StringValue
	} else if err != nil {
		logger.V(4).Info("No PCIe root for GPU", "pciBusID", pciBusID, "err", err)
	}
	return numa, root
}

func int8String(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

func brandName(b nvml.BrandType) string {
	switch b {
	case nvml.BRAND_QUADRO:
		return "Quadro"
	case nvml.BRAND_TESLA:
		return "Tesla"
	case nvml.BRAND_NVS:
		return "NVS"
	case nvml.BRAND_GRID:
		return "GRID"
	case nvml.BRAND_GEFORCE:
		return "GeForce"
	case nvml.BRAND_TITAN:
		return "Titan"
	case nvml.BRAND_NVIDIA:
		return "NVIDIA"
	case nvml.BRAND_QUADRO_RTX:
		return "QuadroRTX"
	case nvml.BRAND_NVIDIA_RTX:
		return "NvidiaRTX"
	default:
		return "Unknown"
	}
}

func architectureName(a nvml.DeviceArchitecture) string {
	switch a {
	case nvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case nvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case nvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case nvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case nvml.DEVICE_ARCH_TURING:
		return "Turing"
	case nvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case nvml.DEVICE_ARCH_ADA:
		return "Ada Lovelace"
	case nvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case nvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	case nvml.DEVICE_ARCH_RUBIN:
		return "Rubin"
	default:
		return "Unknown"
	}
}
