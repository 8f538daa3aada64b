package prepare

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// gpuHandler prepares a whole GPU, used by one claim exclusively: its only
// work is to make sure MIG mode is off.
type gpuHandler struct{}

func (gpuHandler) plan(pub *devicemodel.Published, r resourceapi.DeviceRequestAllocationResult, cfg gpuv1beta1.Config, pd *checkpoint.PreparedDevice) (shareInput, error) {
	if err := checkWholeGPUConfig(cfg, r.Device); err != nil {
		return shareInput{}, err
	}
	pd.UUIDs = []string{pub.GPU.UUID}
	return shareInput{}, nil
}

func (gpuHandler) prepare(ctx context.Context, d *Engine, _ *checkpoint.PreparedClaim, pd *checkpoint.PreparedDevice, _ shareInput) error {
	if err := d.opts.MIG.EnsureOff(ctx, pd.GPUUUID); err != nil {
		return fmt.Errorf("device %s: %w", pd.Device, err)
	}
	return nil
}

// unprepare leaves MIG mode as it is: nothing to undo.
func (gpuHandler) unprepare(context.Context, *Engine, types.UID, *checkpoint.PreparedDevice) error {
	return nil
}

func (gpuHandler) containerEdits(*Engine, *devicemodel.Published, *checkpoint.PreparedDevice, *cdi.ClaimDevice) error {
	return nil
}

// durableStart: turning MIG mode off is the only work beside the spec, and
// nothing undoes it (unprepare leaves MIG mode as it is).
func (gpuHandler) durableStart() bool { return false }

func (gpuHandler) strategy(*checkpoint.PreparedDevice) gpuv1beta1.SharingStrategy { return "" }

// conflict: a whole GPU excludes every other device of it.
func (gpuHandler) conflict(gpu string, a, b checkpoint.PreparedDevice) string {
	if a.Device == b.Device {
		return sameDevice(b)
	}
	return alsoUsed(gpu, b)
}
