// Package hwcheck is the hardware check: it runs the driver's own code
// paths (discovery, --print-slices, prepare/unprepare through the kubelet
// stand-in, health, telemetry) on a node's real GPUs, compares each GPU
// structurally with the simulated GPU of the same model (pkg/nvmlsim), and
// writes what it found as a report (docs/hardware.md describes it).
//
// It never changes a GPU: all NVML access goes through a Guard that refuses
// every setter (MIG mode, instances, compute mode, clocks, resets) and
// records the attempt as a violation. With Config.Hardware.Simulate it runs the same
// checks over a simulated machine, which is how `make check` tests it.
package hwcheck
