package prepare

import (
	"context"
	"encoding/json"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

// TimeSlicing applies time-slicing to a GPU while it has shares.
type TimeSlicing interface {
	Acquire(ctx context.Context, gpu sharing.DeviceRef, shareID string, cfg *gpuv1beta1.TimeSlicingConfig) (*sharing.Result, error)
	Release(ctx context.Context, gpu sharing.DeviceRef, shareID string) error
	Reconcile(ctx context.Context, live []sharing.ShareRef) error
}

// MPS runs an MPS control daemon for a GPU while it has shares.
type MPS interface {
	Acquire(ctx context.Context, dev sharing.DeviceRef, share sharing.MPSShare) (*sharing.Result, error)
	Release(ctx context.Context, dev sharing.DeviceRef, shareID string) error
	Reconcile(ctx context.Context, live []sharing.ShareRef) error
	FinishTeardowns(ctx context.Context) error
}

// shareInput is what acquiring a share needs beyond its checkpoint record.
type shareInput struct {
	config   *gpuv1beta1.GpuSharing
	consumed map[resourceapi.QualifiedName]resource.Quantity
}

// checkShareConfig accepts, for a share device, a GpuConfig whose strategy
// is the device's own, want (or no config); the strategy is what the
// DeviceClass chose, so a config asking for another one is a mistake worth
// reporting.
func checkShareConfig(cfg gpuv1beta1.Config, device string, want gpuv1beta1.SharingStrategy) (*gpuv1beta1.GpuSharing, error) {
	switch c := cfg.(type) {
	case nil:
		return &gpuv1beta1.GpuSharing{Strategy: want}, nil
	case *gpuv1beta1.GpuConfig:
		if c.Sharing == nil || c.Sharing.Strategy == gpuv1beta1.ExclusiveStrategy {
			return &gpuv1beta1.GpuSharing{Strategy: want}, nil
		}
		if c.Sharing.Strategy != want {
			return nil, fmt.Errorf("device %s is a %s share: sharing strategy %q does not apply to it", device, want, c.Sharing.Strategy)
		}
		return c.Sharing, nil
	default:
		return nil, fmt.Errorf("device %s is a GPU share: a %s does not apply to it, use %s", device, cfg.GetObjectKind().GroupVersionKind().Kind, gpuv1beta1.GpuConfigKind)
	}
}

// shareID names a share on the node, stable across restarts.
func shareID(claimUID types.UID, pd *checkpoint.PreparedDevice) string {
	return fmt.Sprintf("%s/%s/%s/%s", claimUID, pd.Request, pd.Device, pd.ShareID)
}

func shareDeviceRef(pub *devicemodel.Published) sharing.DeviceRef {
	return sharing.DeviceRef{UUID: pub.GPU.UUID, Index: pub.GPU.Index}
}

// shareRef is the device a share's strategy acts on: the GPU, or the MIG
// device itself (its UUID is empty until the instance exists).
func (d *Engine) shareRef(pd *checkpoint.PreparedDevice) sharing.DeviceRef {
	pub := d.devices[pd.Device]
	if pd.MIG != nil {
		ref := sharing.DeviceRef{ParentUUID: pd.MIG.ParentUUID}
		if len(pd.UUIDs) > 0 {
			ref.UUID = pd.UUIDs[0]
		}
		if pub != nil {
			ref.Index = pub.GPU.Index
		}
		return ref
	}
	if pub != nil {
		return shareDeviceRef(pub)
	}
	return sharing.DeviceRef{UUID: pd.GPUUUID}
}

// publishedDevice is the published device of a record.
func (d *Engine) publishedDevice(pd *checkpoint.PreparedDevice) (*devicemodel.Published, error) {
	pub := d.devices[pd.Device]
	if pub == nil {
		return nil, fmt.Errorf("device %s is no longer present on this node", pd.Device)
	}
	return pub, nil
}

// acquireShare sets the device up for the share with the strategy's
// manager and records the result (daemon pipe dir, time-slice, container
// edits) in pd.
func (d *Engine) acquireShare(ctx context.Context, claimUID types.UID, pd *checkpoint.PreparedDevice, in shareInput, m shareManager) error {
	if _, err := d.publishedDevice(pd); err != nil {
		return err
	}
	res, err := m.acquire(ctx, d, d.shareRef(pd), shareID(claimUID, pd), pd, in)
	if err != nil {
		return err
	}
	for _, w := range res.Warnings {
		klog.FromContext(ctx).Info("Sharing warning", "device", pd.Device, "warning", w)
	}
	data, err := json.Marshal(res)
	if err != nil {
		return err
	}
	pd.Sharing = &checkpoint.Sharing{Strategy: string(res.Strategy), Config: data}
	return nil
}

// releaseShare undoes acquireShare; it needs only the record's identity,
// so it also cleans up after a crash before the result was recorded.
func (d *Engine) releaseShare(ctx context.Context, claimUID types.UID, pd *checkpoint.PreparedDevice, m shareManager) error {
	ref, id := d.shareRef(pd), shareID(claimUID, pd)
	if ref.UUID == "" {
		return nil // a MIG device whose instance was never created
	}
	return m.release(ctx, d, ref, id)
}

// shareEdits are the container edits recorded for a share.
func shareEdits(pd checkpoint.PreparedDevice) (sharing.ContainerEdits, error) {
	res, err := shareResult(pd)
	return res.Edits, err
}

// shareResult is the sharing result recorded for a device; empty when it
// is not shared.
func shareResult(pd checkpoint.PreparedDevice) (sharing.Result, error) {
	var res sharing.Result
	if pd.Sharing == nil || len(pd.Sharing.Config) == 0 {
		return res, nil
	}
	if err := json.Unmarshal(pd.Sharing.Config, &res); err != nil {
		return sharing.Result{}, fmt.Errorf("device %s: recorded sharing state: %w", pd.Device, err)
	}
	return res, nil
}

// reconcileShares hands each sharing manager the shares the checkpoint
// holds, so it adopts their daemons and settings and undoes the rest.
func (d *Engine) reconcileShares(ctx context.Context) error {
	ts, mps := d.liveShares()
	if d.opts.TimeSlicing != nil {
		if err := d.opts.TimeSlicing.Reconcile(ctx, ts); err != nil {
			return fmt.Errorf("reconcile time-slicing: %w", err)
		}
	}
	if d.opts.MPS != nil {
		if err := d.opts.MPS.Reconcile(ctx, mps); err != nil {
			return fmt.Errorf("reconcile MPS: %w", err)
		}
	}
	return nil
}

// finishTeardowns retries what releasing shares left undone (a GPU lost
// then, back now). Failures stay recorded by the manager for the next try.
func (d *Engine) finishTeardowns(ctx context.Context) {
	if d.opts.MPS == nil {
		return
	}
	if err := d.opts.MPS.FinishTeardowns(ctx); err != nil {
		klog.FromContext(ctx).V(2).Info("MPS teardown still pending", "err", err)
	}
}

// liveShares are the checkpoint's time-slicing and MPS shares.
func (d *Engine) liveShares() (ts, mps []sharing.ShareRef) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for uid, c := range d.cp.All() {
		for i := range c.Devices {
			pd := &c.Devices[i]
			ref := sharing.ShareRef{Device: d.shareRef(pd), ID: shareID(uid, pd)}
			if ref.Device.UUID == "" {
				continue
			}
			switch shareStrategy(pd) {
			case gpuv1beta1.TimeSlicingStrategy:
				ts = append(ts, ref)
			case gpuv1beta1.MPSStrategy:
				mps = append(mps, ref)
			}
		}
	}
	return ts, mps
}
