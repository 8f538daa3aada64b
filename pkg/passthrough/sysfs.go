package passthrough

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// PCI drivers a GPU moves between.
const (
	DriverNVIDIA = "nvidia"
	DriverVFIO   = "vfio-pci"
)

// DefaultTimeout is how long a bind or unbind may take to show in sysfs.
const DefaultTimeout = 10 * time.Second

// pciAddress is the sysfs form of a PCI address, 0000:18:00.0.
var pciAddress = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// Sysfs moves PCI devices between drivers under a sysfs root.
type Sysfs struct {
	// Root is where sysfs is mounted ("/sys" when empty).
	Root string
	// Timeout bounds the wait for a move to show (DefaultTimeout when 0).
	Timeout time.Duration
}

func (s Sysfs) root() string {
	if s.Root == "" {
		return "/sys"
	}
	return s.Root
}

func (s Sysfs) device(bdf string) string { return filepath.Join(s.root(), "bus/pci/devices", bdf) }

// checkAddress refuses anything but a PCI address: it becomes part of sysfs paths.
func checkAddress(bdf string) error {
	if !pciAddress.MatchString(bdf) {
		return fmt.Errorf("%q is not a PCI address like 0000:18:00.0", bdf)
	}
	return nil
}

// Driver returns the driver device bdf is bound to, "" while it is bound to none.
func (s Sysfs) Driver(bdf string) (string, error) {
	if err := checkAddress(bdf); err != nil {
		return "", err
	}
	if _, err := os.Stat(s.device(bdf)); err != nil {
		return "", fmt.Errorf("PCI device %s: %w", bdf, err)
	}
	target, err := os.Readlink(filepath.Join(s.device(bdf), "driver"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("driver of PCI device %s: %w", bdf, err)
	}
	return filepath.Base(target), nil
}

// IOMMUGroup returns the IOMMU group of device bdf, the name of its /dev/vfio/<group> node.
func (s Sysfs) IOMMUGroup(bdf string) (int, error) {
	if err := checkAddress(bdf); err != nil {
		return 0, err
	}
	target, err := os.Readlink(filepath.Join(s.device(bdf), "iommu_group"))
	if err != nil {
		return 0, fmt.Errorf("IOMMU group of PCI device %s (is the IOMMU on? intel_iommu=on or amd_iommu=on): %w", bdf, err)
	}
	group, err := strconv.Atoi(filepath.Base(target))
	if err != nil {
		return 0, fmt.Errorf("IOMMU group of PCI device %s: link %q: %w", bdf, target, err)
	}
	return group, nil
}

// GroupDevices lists the PCI devices of an IOMMU group: vfio-pci hands a guest a whole group, so
// every one of them goes with the GPU.
func (s Sysfs) GroupDevices(group int) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(s.root(), "kernel/iommu_groups", strconv.Itoa(group), "devices"))
	if err != nil {
		return nil, fmt.Errorf("devices of IOMMU group %d: %w", group, err)
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out, nil
}

// ToVFIO binds device bdf to vfio-pci: driver_override=vfio-pci, unbind from its driver, bind to
// vfio-pci. Done already, it does nothing.
func (s Sysfs) ToVFIO(ctx context.Context, bdf string) error {
	return s.move(ctx, bdf, DriverVFIO, DriverVFIO)
}

// ToNVIDIA binds device bdf back to nvidia: driver_override cleared, unbind from vfio-pci, bind to
// nvidia. Done already, it does nothing but clear the override.
func (s Sysfs) ToNVIDIA(ctx context.Context, bdf string) error {
	return s.move(ctx, bdf, DriverNVIDIA, "")
}

// move binds bdf to driver with override in driver_override ("" clears it).
func (s Sysfs) move(ctx context.Context, bdf, driver, override string) error {
	logger := klog.FromContext(ctx).WithValues("device", bdf, "driver", driver)
	current, err := s.Driver(bdf)
	if err != nil {
		return err
	}
	// The override first: the kernel consults it when the device binds, and an override left
	// set by a crash would keep the device from its next driver.
	if err := writeAttr(filepath.Join(s.device(bdf), "driver_override"), override); err != nil {
		return fmt.Errorf("move PCI device %s to %s: %w", bdf, driver, err)
	}
	if current == driver {
		return nil
	}
	if current != "" {
		logger.V(2).Info("Unbinding PCI device", "from", current)
		if err := writeAttr(filepath.Join(s.root(), "bus/pci/drivers", current, "unbind"), bdf); err != nil {
			return fmt.Errorf("unbind PCI device %s from %s: %w", bdf, current, err)
		}
		if err := s.await(ctx, bdf, ""); err != nil {
			return fmt.Errorf("unbind PCI device %s from %s: %w", bdf, current, err)
		}
	}
	logger.V(2).Info("Binding PCI device")
	if err := writeAttr(filepath.Join(s.root(), "bus/pci/drivers", driver, "bind"), bdf); err != nil {
		return fmt.Errorf("bind PCI device %s to %s (is the %s module loaded?): %w", bdf, driver, driver, err)
	}
	if err := s.await(ctx, bdf, driver); err != nil {
		return fmt.Errorf("bind PCI device %s to %s: %w", bdf, driver, err)
	}
	return nil
}

// await reads bdf's driver link until it shows want.
func (s Sysfs) await(ctx context.Context, bdf, want string) error {
	timeout := s.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		got, err := s.Driver(bdf)
		if err != nil {
			return err
		}
		if got == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still bound to %q after %s (the kernel refused; see its log)", got, timeout)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(wait):
		}
	}
}

// writeAttr writes value and a newline to a sysfs attribute, as echo does. O_NONBLOCK is nothing
// to sysfs; it makes a simulated attribute nobody serves fail with ENXIO instead of hanging.
func writeAttr(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q to %s: %w", value, path, err)
	}
	return nil
}
