package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
	"github.com/gpu-dra/gpu-dra-driver/pkg/passthrough"
)

// A GPU bound to vfio-pci (passed through to a virtual machine) is not in NVML, so a plugin that
// starts while one is would not know it: its devices would vanish from the node until the next
// start after the guest gave it back. The inventory file keeps what the last discovery found;
// a GPU it lists that NVML does not, and that sysfs shows bound to vfio-pci, is described from it.

// inventory is the file's content.
type inventory struct {
	GPUs []GPU `json:"gpus"`
}

// addPassedThrough appends to gpus the GPUs of the inventory at path that are bound to vfio-pci
// under sysfsRoot and missing from gpus. An unreadable inventory adds nothing.
func addPassedThrough(ctx context.Context, gpus []GPU, path, sysfsRoot string) []GPU {
	logger := klog.FromContext(ctx)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return gpus
	}
	var inv inventory
	if err == nil {
		err = json.Unmarshal(data, &inv)
	}
	if err != nil {
		logger.Error(err, "GPU inventory unreadable; GPUs passed through to virtual machines stay unpublished until they are back", "file", path)
		return gpus
	}
	sys := passthrough.Sysfs{Root: sysfsRoot}
	for _, g := range inv.GPUs {
		if slices.ContainsFunc(gpus, func(d GPU) bool { return d.UUID == g.UUID || d.PCIBusID == g.PCIBusID }) {
			continue
		}
		if driver, err := sys.Driver(g.PCIBusID); err != nil || driver != passthrough.DriverVFIO {
			continue // gone, or bound elsewhere: not ours to describe
		}
		logger.Info("GPU is bound to vfio-pci; describing it from the inventory", "gpu", g.UUID, "pciBusID", g.PCIBusID)
		if g.MIG != nil {
			// The nvidia driver's unbind destroyed its MIG instances:
			// those the inventory lists are gone, and would otherwise
			// be published as static MIG devices.
			m := *g.MIG
			m.Instances = nil
			g.MIG = &m
		}
		gpus = append(gpus, g)
	}
	sort.Slice(gpus, func(a, b int) bool { return gpus[a].Minor < gpus[b].Minor })
	return gpus
}

// writeInventory records gpus at path.
func writeInventory(path string, gpus []GPU) error {
	data, err := json.MarshalIndent(inventory{GPUs: gpus}, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write GPU inventory: %w", err)
	}
	return nil
}
