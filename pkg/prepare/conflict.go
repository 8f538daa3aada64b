package prepare

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
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
// GPU, and they overlap on it.
func physicalConflict(a, b checkpoint.PreparedDevice) string {
	gpu := gpuUUIDOf(a)
	if gpu != gpuUUIDOf(b) {
		return ""
	}
	isShare := func(kind string) bool { return kind == devicemodel.TypeTimeSlicing || kind == devicemodel.TypeMPS }
	switch {
	case !knownKind(a.Kind) || !knownKind(b.Kind):
		// A newer release's device: what it holds is unknown, so it
		// holds the whole GPU.
		return fmt.Sprintf("GPU %s holds device %s of kind %q", gpu, b.Device, b.Kind)
	case a.Device == b.Device && isShare(a.Kind) && a.ShareID != "" && b.ShareID != "" && a.ShareID != b.ShareID:
		return "" // two shares of one shareable device
	case a.Device == b.Device:
		return fmt.Sprintf("it is device %s", b.Device)
	case a.Kind == devicemodel.TypeGPU || b.Kind == devicemodel.TypeGPU:
		return fmt.Sprintf("GPU %s is also used as %s device %s", gpu, b.Kind, b.Device)
	case a.Kind == devicemodel.TypeMIG && b.Kind == devicemodel.TypeMIG:
		if a.MIG == nil || b.MIG == nil || overlaps(a.MIG.Placement, b.MIG.Placement) {
			return fmt.Sprintf("its MIG placement on GPU %s overlaps that of MIG device %s", gpu, b.Device)
		}
		return ""
	case a.Kind != b.Kind:
		// MIG vs a share (shares need MIG mode off), time-slicing vs
		// MPS (one GPU runs in one compute mode).
		return fmt.Sprintf("GPU %s is also used as %s device %s", gpu, b.Kind, b.Device)
	default:
		return "" // shares of one kind on one GPU
	}
}

// knownKind reports whether this release knows how to prepare and undo a
// device of the kind.
func knownKind(kind string) bool {
	switch kind {
	case devicemodel.TypeGPU, devicemodel.TypeMIG, devicemodel.TypeTimeSlicing, devicemodel.TypeMPS:
		return true
	}
	return false
}

// overlaps reports whether two MIG placements share a memory slice.
func overlaps(a, b checkpoint.MigPlacement) bool {
	return a.Start < b.Start+b.Size && b.Start < a.Start+a.Size
}
