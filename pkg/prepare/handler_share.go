package prepare

import (
	"context"
	"fmt"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

// shareHandler prepares one share of a whole GPU shared by the strategy
// want, which its manager sets up (time-slicing, MPS). Shares of one device
// are told apart by their ShareID.
type shareHandler struct {
	want    gpuv1beta1.SharingStrategy
	manager shareManager
}

// shareManager is one sharing strategy's manager, as the handlers use it:
// the share handler of that strategy, and the MIG handler for MPS inside a
// MIG device.
type shareManager interface {
	// acquire sets the device ref up for share id; its errors name the
	// device pd (a nil manager in Options is one).
	acquire(ctx context.Context, d *Engine, ref sharing.DeviceRef, id string, pd *checkpoint.PreparedDevice, in shareInput) (*sharing.Result, error)
	// release undoes acquire; a nil manager in Options has nothing to undo.
	release(ctx context.Context, d *Engine, ref sharing.DeviceRef, id string) error
}

func (h shareHandler) plan(pub *devicemodel.Published, r resourceapi.DeviceRequestAllocationResult, cfg gpuv1beta1.Config, pd *checkpoint.PreparedDevice) (shareInput, error) {
	sharingCfg, err := checkShareConfig(cfg, pub.Device.Name, h.want)
	if err != nil {
		return shareInput{}, err
	}
	pd.UUIDs = []string{pub.GPU.UUID}
	return shareInput{config: sharingCfg, consumed: r.ConsumedCapacity}, nil
}

func (h shareHandler) prepare(ctx context.Context, d *Engine, entry *checkpoint.PreparedClaim, pd *checkpoint.PreparedDevice, in shareInput) error {
	pub, err := d.publishedDevice(pd)
	if err != nil {
		return err
	}
	if err := d.opts.MIG.EnsureOff(ctx, pub.GPU.UUID); err != nil {
		return fmt.Errorf("device %s: %w", pd.Device, err)
	}
	if err := d.acquireShare(ctx, entry.UID, pd, in, h.manager); err != nil {
		return err
	}
	return d.put(ctx, entry)
}

func (h shareHandler) unprepare(ctx context.Context, d *Engine, claimUID types.UID, pd *checkpoint.PreparedDevice) error {
	return d.releaseShare(ctx, claimUID, pd, h.manager)
}

// containerEdits: a share's edits are recorded with its sharing state,
// which every kind gets.
func (shareHandler) containerEdits(*Engine, *devicemodel.Published, *checkpoint.PreparedDevice, *cdi.ClaimDevice) error {
	return nil
}

// durableStart: time-slice settings and MPS daemons outlive a crash, and
// reconciling them at start trusts the records.
func (shareHandler) durableStart() bool { return true }

func (h shareHandler) strategy(*checkpoint.PreparedDevice) gpuv1beta1.SharingStrategy { return h.want }

// conflict: shares of one strategy on one GPU coexist; one GPU runs in one
// compute mode, so shares of another strategy (and MIG devices, which need
// MIG mode on) do not.
func (shareHandler) conflict(gpu string, a, b checkpoint.PreparedDevice) string {
	switch {
	case a.Device == b.Device && a.ShareID != "" && b.ShareID != "" && a.ShareID != b.ShareID:
		return "" // two shares of one shareable device
	case a.Device == b.Device:
		return sameDevice(b)
	case a.Kind != b.Kind:
		return alsoUsed(gpu, b)
	}
	return ""
}

// timeSliceManager is Options.TimeSlicing.
type timeSliceManager struct{}

func (timeSliceManager) acquire(ctx context.Context, d *Engine, ref sharing.DeviceRef, id string, pd *checkpoint.PreparedDevice, in shareInput) (*sharing.Result, error) {
	if d.opts.TimeSlicing == nil {
		return nil, fmt.Errorf("device %s: time-slicing is not configured on this node", pd.Device)
	}
	res, err := d.opts.TimeSlicing.Acquire(ctx, ref, id, in.config.TimeSlicingConfig)
	if err != nil {
		return nil, deviceError(pd, err)
	}
	// Time-slicing limits no memory: the share is granted its capacity.
	memory := in.consumed[vocabulary.CapacityMemory]
	res.MemoryLimitBytes = memory.Value()
	return res, nil
}

func (timeSliceManager) release(ctx context.Context, d *Engine, ref sharing.DeviceRef, id string) error {
	if d.opts.TimeSlicing == nil {
		return nil
	}
	return d.opts.TimeSlicing.Release(ctx, ref, id)
}

// mpsManager is Options.MPS; a share's consumed capacity is its MPS limits.
type mpsManager struct{}

func (mpsManager) acquire(ctx context.Context, d *Engine, ref sharing.DeviceRef, id string, pd *checkpoint.PreparedDevice, in shareInput) (*sharing.Result, error) {
	if d.opts.MPS == nil {
		return nil, fmt.Errorf("device %s: MPS is not configured on this node", pd.Device)
	}
	compute, memory := in.consumed[vocabulary.CapacityCompute], in.consumed[vocabulary.CapacityMemory]
	share := sharing.MPSShare{ID: id, Config: in.config.MPSConfig, Capacity: sharing.ShareCapacity{
		ComputePercent: int(compute.Value()),
		MemoryBytes:    memory.Value(),
	}}
	res, err := d.opts.MPS.Acquire(ctx, ref, share)
	return res, deviceError(pd, err)
}

// deviceError names the device in err; nil stays nil.
func deviceError(pd *checkpoint.PreparedDevice, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("device %s: %w", pd.Device, err)
}

func (mpsManager) release(ctx context.Context, d *Engine, ref sharing.DeviceRef, id string) error {
	if d.opts.MPS == nil {
		return nil
	}
	return d.opts.MPS.Release(ctx, ref, id)
}
