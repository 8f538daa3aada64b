package nvmlsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	"k8s.io/klog/v2"
)

// pciAddress matches the sysfs form of a PCI address; a pipe read may join two writes, so the
// addresses are found in the text rather than split on newlines.
var pciAddress = regexp.MustCompile(`[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]`)

// ServeSysfs is the simulated kernel of the sysfs tree at root (written by WriteSysfs first): until
// ctx ends it reads the addresses written to bus/pci/drivers/{nvidia,vfio-pci}/{bind,unbind} and
// binds and unbinds the GPUs as the kernel does, updating the driver links, NVML's view of the
// GPUs and the driver roots' dev/vfio nodes. Without it (or after ctx ends) writes to those
// attributes either block or, opened with O_NONBLOCK, fail with ENXIO.
func (m *Machine) ServeSysfs(ctx context.Context, root string) error {
	logger := klog.FromContext(ctx).WithValues("sysfs", root)
	var files []*os.File
	for _, d := range pciDrivers {
		for _, attr := range []string{"bind", "unbind"} {
			// Read-write, so that the pipe always has a writer: reads block instead of
			// ending when a writer closes, and writers never find the pipe without a reader.
			f, err := os.OpenFile(filepath.Join(root, "bus/pci/drivers", d, attr), os.O_RDWR, 0)
			if err != nil {
				for _, f := range files {
					_ = f.Close()
				}
				return fmt.Errorf("simulated kernel of %s: %w", root, err)
			}
			files = append(files, f)
			go m.serveAttribute(logger, f, root, d, attr)
		}
	}
	go func() {
		<-ctx.Done()
		for _, f := range files {
			_ = f.Close()
		}
	}()
	return nil
}

func (m *Machine) serveAttribute(logger klog.Logger, f *os.File, root, driver, attr string) {
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		for _, bdf := range pciAddress.FindAll(buf[:n], -1) {
			logger.V(2).Info("Simulated kernel", "driver", driver, "op", attr, "device", string(bdf))
			m.bindOp(root, driver, attr, string(bdf))
		}
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				logger.Error(err, "Simulated kernel stopped reading", "attribute", f.Name())
			}
			return
		}
	}
}

// addSysfsRoot remembers root, whose links the kernel keeps current. m.mu must be held.
func (m *Machine) addSysfsRoot(root string) {
	if !slices.Contains(m.sysfsRoots, root) {
		m.sysfsRoots = append(m.sysfsRoots, root)
	}
}
