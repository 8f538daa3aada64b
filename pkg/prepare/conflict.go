package prepare

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// conflictLocked is the last line of defense against handing hardware to
// two claims: the scheduler's counters should never allocate overlapping
// devices, but a stale allocation must not give a second pod the same GPU,
// nor a whole GPU while a MIG device of it is in use (the whole-GPU claim
// would silently run with MIG mode left on). Caller holds d.mu.
func (d *Engine) conflictLocked(uid types.UID, planned []checkpoint.PreparedDevice) error {
	// One claim's own devices must not overlap either.
	for i, pd := range planned {
		for _, od := range planned[i+1:] {
			if why := physicalConflict(pd, od); why != "" {
				return fmt.Errorf("device %s overlaps device %s of the same claim: %s", pd.Device, od.Device, why)
			}
		}
	}
	for otherUID, other := range d.cp.All() {
		if otherUID == uid {
			continue
		}
		for _, od := range other.Devices {
			for _, pd := range planned {
				if why := physicalConflict(pd, od); why != "" {
					return fmt.Errorf("device %s overlaps what is already prepared for claim %s/%s (%s): %s", pd.Device, other.Namespace, other.Name, otherUID, why)
				}
			}
		}
	}
	return nil
}

// physicalConflict says why devices a and b cannot be in use at the same
// time, or "" if they can: both are, or are carved from, the same physical
// GPU, neither is admin access, and they overlap on it (the handler of a's
// kind knows how).
func physicalConflict(a, b checkpoint.PreparedDevice) string {
	gpu := gpuUUIDOf(a)
	if gpu != gpuUUIDOf(b) || a.AdminAccess || b.AdminAccess {
		return "" // admin access is used beside any holder (admin.go)
	}
	h, ok := kindHandlers[a.Kind]
	if !ok || !knownKind(b.Kind) {
		// A newer release's device: what it holds is unknown, so it
		// holds the whole GPU.
		return fmt.Sprintf("GPU %s holds device %s of kind %q", gpu, b.Device, b.Kind)
	}
	return h.conflict(gpu, a, b)
}

// sameDevice is why a device cannot be used twice.
func sameDevice(b checkpoint.PreparedDevice) string {
	return fmt.Sprintf("it is device %s", b.Device)
}

// alsoUsed is why a device conflicts with device b of its GPU.
func alsoUsed(gpu string, b checkpoint.PreparedDevice) string {
	return fmt.Sprintf("GPU %s is also used as %s device %s", gpu, b.Kind, b.Device)
}

// overlaps reports whether two MIG placements share a memory slice.
func overlaps(a, b checkpoint.MigPlacement) bool {
	return a.Start < b.Start+b.Size && b.Start < a.Start+a.Size
}
