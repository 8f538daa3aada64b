package passthrough

import (
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// InUse says what uses GPU uuid, as NVML sees it, or returns nil when nothing does: a GPU with
// running processes (CUDA, graphics, MPS clients, an MPS server) or MIG devices must not be taken
// from the host. A GPU NVML does not know (already bound to vfio-pci) is in use by nothing NVML
// can see; the caller checks its binding.
func InUse(lib nvml.Interface, uuid string) error {
	dev, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret == nvml.ERROR_NOT_FOUND {
		return nil
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %s: get handle: %w", uuid, ret)
	}
	var pids []string
	for _, list := range []struct {
		what string
		f    func() ([]nvml.ProcessInfo, nvml.Return)
	}{
		{"compute", dev.GetComputeRunningProcesses},
		{"graphics", dev.GetGraphicsRunningProcesses},
		{"MPS", dev.GetMPSComputeRunningProcesses},
	} {
		procs, ret := list.f()
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %s: list %s processes: %w", uuid, list.what, ret)
		}
		for _, p := range procs {
			if pid := fmt.Sprint(p.Pid); !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
	}
	if len(pids) > 0 {
		return fmt.Errorf("GPU %s is in use by processes %s", uuid, strings.Join(pids, ", "))
	}
	current, _, ret := dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED || (ret == nvml.SUCCESS && current != nvml.DEVICE_MIG_ENABLE) {
		return nil
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %s: get MIG mode: %w", uuid, ret)
	}
	max, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %s: get MIG device count: %w", uuid, ret)
	}
	var migs []string
	for i := range max {
		mig, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %s: get MIG device %d: %w", uuid, i, ret)
		}
		if u, ret := mig.GetUUID(); ret == nvml.SUCCESS {
			migs = append(migs, u)
		} else {
			migs = append(migs, fmt.Sprintf("index %d", i))
		}
	}
	if len(migs) > 0 {
		return fmt.Errorf("GPU %s has MIG devices %s", uuid, strings.Join(migs, ", "))
	}
	return nil
}
