// Package mig knows the MIG (Multi-Instance GPU) geometry of a GPU and manages the lifecycle of
// its GPU and compute instances through nvml.Interface, for both the device model (which profiles
// and placements exist) and the prepare path (create and destroy the instance a claim was
// allocated).
//
// # Dynamic lifecycle
//
// A MIG device is a GPU instance (GI: memory slices, compute slices and media engines at a fixed
// placement) plus a compute instance (CI) inside it. This package creates exactly one CI per GI,
// the one spanning all of the GI's compute slices, so a GI and its MIG device are one unit:
//
//   - Create enables MIG mode if it is off, creates the GI at the exact placement the scheduler
//     allocated (CreateGpuInstanceWithPlacement, never NVML's own choice) and then its full CI.
//     It is idempotent: a retry adopts an instance with that profile and placement, and completes
//     one left without its CI by a crash. If the CI cannot be created, the GI it just created is
//     destroyed again.
//   - Destroy removes the CI, then the GI; whatever is already gone counts as destroyed.
//   - DisableIfUnused turns MIG mode off when no GI remains, so the whole GPU (and time-slicing
//     or MPS shares of it) can be used again.
//
// Callers serialize these calls per GPU: NVML's MIG calls are not transactions, and the checks
// here (is the placement free, are there instances left) are only meaningful under such a lock.
//
// # MIG mode and GPU resets
//
// The NVIDIA MIG User Guide (Deployment Considerations) says: "Setting MIG mode on the A100/A30
// requires a GPU reset (and thus super-user privileges). Once the GPU is in MIG mode, instance
// management is then dynamic." and "All daemons holding handles on driver modules need to be
// stopped before MIG enablement." NVML's nvmlDeviceSetMigMode documentation adds that the call
// "may unbind or reset the device to activate the requested mode", so that attributes such as the
// minor number may change; that where reset is not exposed (pass-through virtualization) the
// activation status is NVML_ERROR_RESET_REQUIRED; and that it is NVML_ERROR_IN_USE when the
// device is not idle. The guide names only the Ampere parts (A100, A30) as requiring a reset; it
// states no such requirement for Hopper (H100, H200) or Blackwell (B200). Per the NVML
// documentation SetMigMode resets an idle device itself where the platform allows it, so the new
// mode is current at once; pkg/nvmlsim simulates every machine that way. This package does not rely on the architecture: after
// SetMigMode it reads the mode back, and if the current mode still differs from the pending one
// (an A100 whose reset did not happen, a VM in pass-through; the NVML return says why) it fails
// with ErrResetRequired, which an operator resolves with `nvidia-smi -r` or a reboot. It only
// enables MIG mode on a GPU without running processes.
//
// # Names
//
// Profile names are derived as nvidia-smi prints them: "<compute slices>g.<memory>gb" plus "+me",
// "+me.all", "-me" or "+gfx" for the media-extension and graphics variants. The memory figure is
// the profile's share of the GPU's memory rounded up to eighths, times the GPU's memory in GiB
// rounded up, rounded to the nearest integer (1g.18gb on a 141 GB H200, 1g.23gb on a B200).
package mig
