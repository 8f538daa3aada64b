package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
)

// plannedDevice is the checkpoint record of one allocated device before any
// work is done: enough to find and undo that work after a crash.
func plannedDevice(pub *devicemodel.Published, r resourceapi.DeviceRequestAllocationResult, cfg gpuv1beta1.Config) (checkpoint.PreparedDevice, shareInput, error) {
	var in shareInput
	pd := checkpoint.PreparedDevice{
		Request: r.Request, Pool: r.Pool, Device: r.Device,
		Kind: pub.Type, GPUUUID: pub.GPU.UUID,
	}
	if r.ShareID != nil {
		pd.ShareID = string(*r.ShareID)
	}
	switch {
	case pub.Type == devicemodel.TypeGPU:
		if err := checkWholeGPUConfig(cfg, r.Device); err != nil {
			return pd, in, err
		}
		pd.UUIDs = []string{pub.GPU.UUID}
	case pub.StaticMIG != nil:
		if err := planMIGSharing(cfg, r.Device, &pd, &in); err != nil {
			return pd, in, err
		}
		inst := pub.StaticMIG
		pd.UUIDs = []string{inst.UUID}
		pd.MIG = &checkpoint.MigInstance{
			ParentUUID: pub.GPU.UUID, GIProfileID: inst.Profile.ID,
			Placement: checkpoint.MigPlacement(inst.Placement), GIID: inst.GIID, CIID: inst.CIID,
		}
	case pub.Type == devicemodel.TypeMIG:
		if err := planMIGSharing(cfg, r.Device, &pd, &in); err != nil {
			return pd, in, err
		}
		// Recorded before the instance exists: profile and placement
		// are what a restart needs to find what a crash left behind.
		pd.MIG = &checkpoint.MigInstance{
			ParentUUID: pub.GPU.UUID, GIProfileID: pub.MIGProfile.ID,
			Placement: checkpoint.MigPlacement(pub.Placement), CreatedByDriver: true,
		}
	case pub.Type == devicemodel.TypeTimeSlicing || pub.Type == devicemodel.TypeMPS:
		sharingCfg, err := checkShareConfig(cfg, pub)
		if err != nil {
			return pd, in, err
		}
		pd.UUIDs = []string{pub.GPU.UUID}
		in = shareInput{config: sharingCfg, consumed: r.ConsumedCapacity}
	default:
		return pd, in, fmt.Errorf("device %s: unknown device type %q", r.Device, pub.Type)
	}
	return pd, in, nil
}

// prepareDevices does the device work of a claim recorded as
// PrepareStarted, updating the record (e.g. with MIG instance IDs) as it goes.
func (d *Engine) prepareDevices(ctx context.Context, entry *checkpoint.PreparedClaim, inputs []shareInput) error {
	for i := range entry.Devices {
		pd := &entry.Devices[i]
		switch {
		case pd.Kind == devicemodel.TypeTimeSlicing || pd.Kind == devicemodel.TypeMPS:
			if err := d.acquireShare(ctx, entry.UID, pd, inputs[i]); err != nil {
				return err
			}
			if err := d.put(ctx, entry); err != nil {
				return err
			}
		case pd.Kind == devicemodel.TypeGPU:
			if err := d.ensureMIGOff(ctx, pd.GPUUUID); err != nil {
				return fmt.Errorf("device %s: %w", pd.Device, err)
			}
		case pd.MIG != nil:
			if pd.MIG.CreatedByDriver {
				if err := d.createMIG(ctx, entry, pd); err != nil {
					return err
				}
			}
			if shareStrategy(pd) == "" {
				continue
			}
			// MPS inside the MIG device: its daemon needs the instance.
			if err := d.acquireShare(ctx, entry.UID, pd, inputs[i]); err != nil {
				return err
			}
			if err := d.put(ctx, entry); err != nil {
				return err
			}
		}
	}
	return nil
}

// createMIG creates the MIG instance a claim's dynamic MIG device needs and
// records its IDs and UUID.
func (d *Engine) createMIG(ctx context.Context, entry *checkpoint.PreparedClaim, pd *checkpoint.PreparedDevice) error {
	dev, err := d.handle(pd.MIG.ParentUUID)
	if err != nil {
		return err
	}
	if err := d.recordMIGIntent(entry, pd); err != nil {
		return err
	}
	inst, err := mig.Create(ctx, dev, pd.MIG.GIProfileID, mig.Placement(pd.MIG.Placement))
	if err != nil {
		return fmt.Errorf("device %s: %w", pd.Device, err)
	}
	pd.MIG.GIID, pd.MIG.CIID = inst.GIID, inst.CIID
	pd.UUIDs = []string{inst.UUID}
	if err := d.put(ctx, entry); err != nil {
		return err
	}
	d.fault(FaultPrepareMIGCreated)
	return nil
}

// unprepareDevices undoes prepareDevices, in reverse, tolerating work that
// was never done or is already undone.
func (d *Engine) unprepareDevices(ctx context.Context, entry *checkpoint.PreparedClaim) error {
	var errs []error
	for i := len(entry.Devices) - 1; i >= 0; i-- {
		pd := &entry.Devices[i]
		var err error
		if shareStrategy(pd) != "" {
			// Before the MIG instance goes: its MPS daemon runs on it.
			err = d.releaseShare(ctx, entry.UID, pd)
		}
		if err == nil && pd.MIG != nil && pd.MIG.CreatedByDriver {
			if err = d.destroyMIG(ctx, pd.MIG); err == nil {
				err = d.forgetMIGIntent(entry.UID, pd.MIG)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("device %s: %w", pd.Device, err))
		}
	}
	return errors.Join(errs...)
}

// destroyMIG removes the instance a claim created, found by the profile
// and placement recorded before it was created.
func (d *Engine) destroyMIG(ctx context.Context, m *checkpoint.MigInstance) error {
	dev, err := d.handle(m.ParentUUID)
	if err != nil {
		return err
	}
	inst, err := mig.Find(dev, m.GIProfileID, mig.Placement(m.Placement))
	if err != nil {
		return err
	}
	if inst == nil {
		return nil
	}
	ciID := inst.CIID
	if !inst.Complete() && len(inst.ComputeInstances) > 0 {
		ciID = inst.ComputeInstances[0].ID
	}
	klog.FromContext(ctx).V(4).Info("Destroying MIG instance", "gpu", m.ParentUUID, "gi", inst.GIID, "ci", ciID)
	return mig.Destroy(ctx, dev, inst.GIID, ciID)
}

// ensureMIGOff takes a GPU out of MIG mode when it has no instances left,
// so it can be used whole or shared. MIG mode is left on after the last MIG
// device goes: switching costs time (and a reset on A100), and the next MIG
// claim may come soon.
func (d *Engine) ensureMIGOff(ctx context.Context, gpuUUID string) error {
	dev, err := d.handle(gpuUUID)
	if err != nil {
		return err
	}
	current, _, ret := dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED || (ret == nvml.SUCCESS && current != nvml.DEVICE_MIG_ENABLE) {
		return nil
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("get MIG mode of %s: %w", gpuUUID, ret)
	}
	if _, err := mig.DisableIfUnused(ctx, dev); err != nil {
		return fmt.Errorf("turn off MIG mode: %w", err)
	}
	return nil
}

func (d *Engine) handle(uuid string) (nvml.Device, error) {
	dev, ret := d.opts.NVML.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get GPU %s: %w", uuid, ret)
	}
	return dev, nil
}

// containerEdits is what a container gets for one prepared device.
func (d *Engine) containerEdits(pd checkpoint.PreparedDevice) (cdi.ClaimDevice, error) {
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
		if ok {
			caps, err := mig.CapDeviceNodes(d.opts.DriverRoot, pub.GPU.Minor, pd.MIG.GIID, pd.MIG.CIID)
			if err != nil {
				return cd, fmt.Errorf("device %s: MIG capability nodes: %w", pd.Device, err)
			}
			cd.DeviceNodes = append(cd.DeviceNodes, caps...)
		}
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

// planMIGSharing accepts the configs a MIG device supports and plans MPS
// inside it when the config asks for it. TimeSlicing needs no set-up: the
// containers of a MIG device share it with the parent GPU's time slice
// (docs/sharing.md).
func planMIGSharing(cfg gpuv1beta1.Config, device string, pd *checkpoint.PreparedDevice, in *shareInput) error {
	switch c := cfg.(type) {
	case nil:
		return nil
	case *gpuv1beta1.MigDeviceConfig:
		if c.Sharing == nil || c.Sharing.Strategy != gpuv1beta1.MPSStrategy {
			return nil
		}
		// Recorded before any work, so a rollback after a crash knows
		// to stop the daemon.
		pd.Sharing = &checkpoint.Sharing{Strategy: string(gpuv1beta1.MPSStrategy)}
		in.config = &gpuv1beta1.GpuSharing{Strategy: gpuv1beta1.MPSStrategy, MPSConfig: c.Sharing.MPSConfig}
		return nil
	default:
		return fmt.Errorf("device %s is a MIG device: a %s does not apply to it, use %s", device, cfg.GetObjectKind().GroupVersionKind().Kind, gpuv1beta1.MigDeviceConfigKind)
	}
}
