package passthrough

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Host takes GPUs from the host for virtual machines and gives them back.
type Host struct {
	Sysfs Sysfs
	// NVML is initialized; it tells whether a GPU is in use.
	NVML nvml.Interface
}

// Take binds GPU uuid, PCI device bdf, to vfio-pci, refusing while anything uses the GPU. A GPU
// already bound to vfio-pci (an earlier try that a crash cut short) is finished, not checked: NVML
// no longer sees it.
func (h Host) Take(ctx context.Context, uuid, bdf string) error {
	driver, err := h.Sysfs.Driver(bdf)
	if err != nil {
		return err
	}
	if driver != DriverVFIO {
		if err := InUse(h.NVML, uuid); err != nil {
			return fmt.Errorf("cannot pass GPU %s (%s) through: %w", uuid, bdf, err)
		}
	}
	return h.Sysfs.ToVFIO(ctx, bdf)
}

// Give binds PCI device bdf back to nvidia and clears its driver_override, whatever step an
// earlier Take or Give reached.
func (h Host) Give(ctx context.Context, bdf string) error {
	return h.Sysfs.ToNVIDIA(ctx, bdf)
}

// DeviceNodes are the nodes a virtual machine's launcher needs for PCI device bdf: its IOMMU
// group's /dev/vfio/<group> and the VFIO container, /dev/vfio/vfio.
func (h Host) DeviceNodes(bdf string) ([]string, error) {
	group, err := h.Sysfs.IOMMUGroup(bdf)
	if err != nil {
		return nil, err
	}
	return []string{fmt.Sprintf("/dev/vfio/%d", group), "/dev/vfio/vfio"}, nil
}
