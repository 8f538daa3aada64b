// Package passthrough hands whole GPUs to virtual machines (KubeVirt, Kata): it moves a GPU's PCI
// function from the nvidia driver to vfio-pci and back through sysfs (driver_override, unbind,
// bind), names the IOMMU group whose /dev/vfio/<group> a guest's VMM opens, and checks through NVML
// that nothing uses a GPU before it is taken from the host (processes, MIG devices).
//
// It does only what an administrator would do with a shell on the host, so the same code runs on
// real GPUs and on the simulated sysfs of pkg/nvmlsim (whose kernel applies a bind just after the
// write returns: every move is read back from the driver link until it shows, which on a host it
// does at once). Every operation is idempotent: run again after a crash at any step, it finishes
// the move (docs/device-model.md, "Passthrough").
package passthrough
