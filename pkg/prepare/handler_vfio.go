package prepare

import (
	"context"
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// vfioHandler prepares a passthrough device: the GPU leaves the nvidia
// driver for vfio-pci, and the claim's containers (a virtual machine's
// launcher) get its IOMMU group's VFIO node instead of /dev/nvidia<N>.
// Unprepare binds it back to nvidia.
type vfioHandler struct{}

var errNoPassthrough = errors.New("this node's plugin cannot pass GPUs through (no sysfs access)")

func (vfioHandler) plan(pub *devicemodel.Published, r resourceapi.DeviceRequestAllocationResult, cfg gpuv1beta1.Config, pd *checkpoint.PreparedDevice) (shareInput, error) {
	if pd.AdminAccess {
		// A VFIO group has one user at a time, the guest's VMM: there is
		// nothing to hand out beside it.
		return shareInput{}, fmt.Errorf("device %s is a GPU passed through to a virtual machine: admin access does not apply to it (ask for the GPU's whole-GPU device %s)", r.Device, pub.GPU.CanonicalName())
	}
	if err := checkWholeGPUConfig(cfg, r.Device); err != nil {
		return shareInput{}, err
	}
	// The binding intent, durable before anything is bound: a restart
	// binds the device back to nvidia by it.
	pd.VFIOPCIBusID = pub.GPU.PCIBusID
	return shareInput{}, nil
}

func (vfioHandler) prepare(ctx context.Context, d *Engine, entry *checkpoint.PreparedClaim, pd *checkpoint.PreparedDevice, _ shareInput) error {
	if d.opts.Passthrough == nil {
		return fmt.Errorf("device %s: %w", pd.Device, errNoPassthrough)
	}
	// Beside the checkpoint, so a checkpoint lost before the spec is
	// written still tells the next start to give the GPU back.
	if err := d.recordVFIOIntent(entry, pd); err != nil {
		return err
	}
	if err := d.opts.Passthrough.Take(ctx, pd.GPUUUID, pd.VFIOPCIBusID); err != nil {
		return fmt.Errorf("device %s: %w", pd.Device, err)
	}
	d.fault(FaultPrepareVFIOBound)
	return nil
}

// unprepare binds the GPU back to nvidia, from whatever step prepare (or
// an earlier unprepare) reached.
func (vfioHandler) unprepare(ctx context.Context, d *Engine, claimUID types.UID, pd *checkpoint.PreparedDevice) error {
	if pd.VFIOPCIBusID == "" {
		return nil // never bound
	}
	if d.opts.Passthrough == nil {
		return errNoPassthrough
	}
	if err := d.opts.Passthrough.Give(ctx, pd.VFIOPCIBusID); err != nil {
		return err
	}
	return d.forgetVFIOIntent(claimUID, pd.VFIOPCIBusID)
}

// containerEdits replaces the GPU's node with the VFIO nodes.
func (vfioHandler) containerEdits(d *Engine, _ *devicemodel.Published, pd *checkpoint.PreparedDevice, cd *cdi.ClaimDevice) error {
	if d.opts.Passthrough == nil {
		return fmt.Errorf("device %s: %w", pd.Device, errNoPassthrough)
	}
	nodes, err := d.opts.Passthrough.DeviceNodes(pd.VFIOPCIBusID)
	if err != nil {
		return fmt.Errorf("device %s: %w", pd.Device, err)
	}
	cd.DeviceNodes = nodes
	return nil
}

// durableStart: the binding to vfio-pci outlives a crash; the record is how
// it is found and undone.
func (vfioHandler) durableStart() bool { return true }

func (vfioHandler) strategy(*checkpoint.PreparedDevice) gpuv1beta1.SharingStrategy { return "" }

// conflict: a passed-through GPU excludes every other device of it.
func (vfioHandler) conflict(gpu string, a, b checkpoint.PreparedDevice) string {
	return gpuHandler{}.conflict(gpu, a, b)
}
