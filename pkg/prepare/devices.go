package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// prepareDevices does the device work of a claim recorded as
// PrepareStarted, updating the record (e.g. with MIG instance IDs) as it goes.
func (d *Engine) prepareDevices(ctx context.Context, entry *checkpoint.PreparedClaim, inputs []shareInput) error {
	for i := range entry.Devices {
		pd := &entry.Devices[i]
		if pd.AdminAccess {
			if err := d.prepareAdmin(ctx, pd); err != nil {
				return err
			}
			continue
		}
		h, err := handlerOf(pd)
		if err != nil {
			return err
		}
		if err := h.prepare(ctx, d, entry, pd, inputs[i]); err != nil {
			return err
		}
	}
	return nil
}

// unprepareDevices undoes prepareDevices, in reverse, tolerating work that
// was never done or is already undone.
func (d *Engine) unprepareDevices(ctx context.Context, entry *checkpoint.PreparedClaim) error {
	var errs []error
	for i := len(entry.Devices) - 1; i >= 0; i-- {
		pd := &entry.Devices[i]
		if pd.AdminAccess {
			continue // nothing was set up: the CDI spec was all
		}
		h, err := handlerOf(pd)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := h.unprepare(ctx, d, entry.UID, pd); err != nil {
			errs = append(errs, fmt.Errorf("device %s: %w", pd.Device, err))
		}
	}
	return errors.Join(errs...)
}

// containerEdits is what a container gets for one prepared device.
func (d *Engine) containerEdits(pd checkpoint.PreparedDevice) (cdi.ClaimDevice, error) {
	if pd.Kind == vocabulary.KindIMEXChannel {
		return d.channelEdits(pd)
	}
	pub, ok := d.devices[pd.Device]
	if !ok && len(pd.DeviceNodes) == 0 {
		return cdi.ClaimDevice{}, fmt.Errorf("device %s is no longer present on this node", pd.Device)
	}
	cd := cdi.ClaimDevice{Name: pd.Device, DeviceRecord: cdi.DeviceRecord{
		Request: pd.Request, Pool: pd.Pool, Device: pd.Device,
		ShareID: pd.ShareID, Kind: pd.Kind, UUIDs: pd.UUIDs,
	}}
	if ok {
		cd.DeviceNodes = []string{pub.GPU.DeviceNode()}
	} else {
		// The GPU is not published at this start (lost, in reset): the
		// nodes recorded when the claim was prepared still name it, and a
		// prepared claim must keep a spec its containers can start with.
		cd.DeviceNodes = slices.Clone(pd.DeviceNodes)
	}
	edits, err := shareEdits(pd)
	if err != nil {
		return cd, err
	}
	cd.Env = edits.Env
	cd.Mounts = append(cd.Mounts, edits.Mounts...)
	// Kept in the spec so a lost checkpoint can be rebuilt with what
	// unprepare and the sharing managers need: the physical GPU (also when
	// it is lost at the next start), the sharing record (a share's daemon
	// or time-slice stays registered) and the MIG instance to destroy.
	cd.Annotations = map[string]string{annotationGPU: gpuUUIDOf(pd)}
	if pd.AdminAccess {
		cd.Annotations[annotationAdminAccess] = "true"
	}
	if pd.VFIOPCIBusID != "" {
		cd.Annotations[annotationVFIO] = pd.VFIOPCIBusID
	}
	if pd.Sharing != nil {
		data, err := json.Marshal(pd.Sharing)
		if err != nil {
			return cd, err
		}
		cd.Annotations[annotationSharing] = string(data)
	}
	if pd.MIG != nil {
		data, err := json.Marshal(pd.MIG)
		if err != nil {
			return cd, err
		}
		cd.Annotations[annotationMIG] = string(data)
	}
	h, err := handlerOf(&pd)
	if err != nil {
		return cd, err
	}
	if err := h.containerEdits(d, pub, &pd, &cd); err != nil {
		return cd, err
	}
	cd.Annotations[annotationDeviceNodes] = strings.Join(cd.DeviceNodes, ",")
	return cd, nil
}

// Annotations of a device in its claim's CDI spec: the device's physical
// GPU, and its MIG and sharing checkpoint records (JSON).
const (
	annotationGPU     = "gpu.dra.dev/gpu"
	annotationMIG     = "gpu.dra.dev/mig"
	annotationSharing = "gpu.dra.dev/sharing"
	// annotationDeviceNodes lists the device's nodes (comma-separated), so
	// a rebuilt checkpoint can write the spec again while the GPU is lost.
	annotationDeviceNodes = "gpu.dra.dev/device-nodes"
	// annotationAdminAccess marks an admin-access device, so a rebuilt
	// checkpoint neither counts it as held nor undoes its tenant's work.
	annotationAdminAccess = "gpu.dra.dev/admin-access"
	// annotationVFIO is a passthrough device's PCI address, so a rebuilt
	// checkpoint binds it back to nvidia at unprepare.
	annotationVFIO = "gpu.dra.dev/vfio-pci-bus-id"
)

// gpuUUIDOf is the physical GPU a recorded device belongs to.
func gpuUUIDOf(pd checkpoint.PreparedDevice) string {
	switch {
	case pd.GPUUUID != "":
		return pd.GPUUUID
	case pd.MIG != nil:
		return pd.MIG.ParentUUID
	case len(pd.UUIDs) > 0:
		return pd.UUIDs[0]
	default:
		return pd.Device
	}
}
