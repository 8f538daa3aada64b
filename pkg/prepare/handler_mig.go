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
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
)

// migHandler prepares a MIG device: a dynamic one is created for the claim
// and destroyed after it, a static one (an instance that existed before) is
// handed out as it is. A MigDeviceConfig may ask for MPS inside the device:
// the MPS share's manager then runs a daemon on the instance (composition,
// not a kind of its own: the record stays a MIG device's).
type migHandler struct{}

func (migHandler) plan(pub *devicemodel.Published, r resourceapi.DeviceRequestAllocationResult, cfg gpuv1beta1.Config, pd *checkpoint.PreparedDevice) (shareInput, error) {
	var in shareInput
	if err := planMIGSharing(cfg, r.Device, pd, &in); err != nil {
		return in, err
	}
	if inst := pub.StaticMIG; inst != nil {
		pd.UUIDs = []string{inst.UUID}
		pd.MIG = &checkpoint.MigInstance{
			ParentUUID: pub.GPU.UUID, GIProfileID: inst.Profile.ID,
			Placement: checkpoint.MigPlacement(inst.Placement), GIID: inst.GIID, CIID: inst.CIID,
		}
		return in, nil
	}
	// Recorded before the instance exists: profile and placement are what
	// a restart needs to find what a crash left behind.
	pd.MIG = &checkpoint.MigInstance{
		ParentUUID: pub.GPU.UUID, GIProfileID: pub.MIGProfile.ID,
		Placement: checkpoint.MigPlacement(pub.Placement), CreatedByDriver: true,
	}
	return in, nil
}

func (migHandler) prepare(ctx context.Context, d *Engine, entry *checkpoint.PreparedClaim, pd *checkpoint.PreparedDevice, in shareInput) error {
	if pd.MIG == nil {
		return nil
	}
	if pd.MIG.CreatedByDriver {
		if err := createMIG(ctx, d, entry, pd); err != nil {
			return err
		}
	}
	if mpsInsideMIG(pd) == "" {
		return nil
	}
	// MPS inside the MIG device: its daemon needs the instance.
	if err := d.acquireShare(ctx, entry.UID, pd, in, mpsManager{}); err != nil {
		return err
	}
	return d.put(ctx, entry)
}

// createMIG creates the MIG instance a claim's dynamic MIG device needs and
// records its IDs and UUID.
func createMIG(ctx context.Context, d *Engine, entry *checkpoint.PreparedClaim, pd *checkpoint.PreparedDevice) error {
	recorded := false
	inst, err := d.opts.MIG.Create(ctx, pd.MIG.ParentUUID, pd.MIG.GIProfileID, mig.Placement(pd.MIG.Placement), func() error {
		if err := d.recordMIGIntent(entry, pd); err != nil {
			return err
		}
		recorded = true
		return nil
	})
	switch {
	case err != nil && !recorded:
		return err // the GPU is out of reach, or the intent unwritten: both say so
	case err != nil:
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

func (migHandler) unprepare(ctx context.Context, d *Engine, claimUID types.UID, pd *checkpoint.PreparedDevice) error {
	if mpsInsideMIG(pd) != "" {
		// Before the MIG instance goes: its MPS daemon runs on it.
		if err := d.releaseShare(ctx, claimUID, pd, mpsManager{}); err != nil {
			return err
		}
	}
	if pd.MIG == nil || !pd.MIG.CreatedByDriver {
		return nil
	}
	if err := d.destroyMIG(ctx, pd.MIG); err != nil {
		return err
	}
	return d.forgetMIGIntent(claimUID, pd.MIG)
}

// destroyMIG removes the instance a claim created, found by the profile
// and placement recorded before it was created.
func (d *Engine) destroyMIG(ctx context.Context, m *checkpoint.MigInstance) error {
	return d.opts.MIG.Destroy(ctx, m.ParentUUID, m.GIProfileID, mig.Placement(m.Placement))
}

// containerEdits adds the MIG device's capability nodes, which need the
// GPU's minor: a device not published at this start keeps the nodes
// recorded when it was prepared.
func (migHandler) containerEdits(d *Engine, pub *devicemodel.Published, pd *checkpoint.PreparedDevice, cd *cdi.ClaimDevice) error {
	if pd.MIG == nil || pub == nil {
		return nil
	}
	caps, err := d.opts.MIG.CapDeviceNodes(pub.GPU.Minor, pd.MIG.GIID, pd.MIG.CIID)
	if err != nil {
		return fmt.Errorf("device %s: MIG capability nodes: %w", pd.Device, err)
	}
	cd.DeviceNodes = append(cd.DeviceNodes, caps...)
	return nil
}

// durableStart: the MIG instance (and an MPS daemon inside it) outlives a
// crash; the record, with the intent file, is how it is found again.
func (migHandler) durableStart() bool { return true }

func (migHandler) strategy(pd *checkpoint.PreparedDevice) gpuv1beta1.SharingStrategy {
	return mpsInsideMIG(pd)
}

// conflict: MIG devices of one GPU coexist when their placements do not
// overlap; a MIG device excludes every other kind (whole use, and shares,
// which need MIG mode off).
func (migHandler) conflict(gpu string, a, b checkpoint.PreparedDevice) string {
	switch {
	case a.Device == b.Device:
		return sameDevice(b)
	case b.Kind != a.Kind:
		return alsoUsed(gpu, b)
	case a.MIG == nil || b.MIG == nil || overlaps(a.MIG.Placement, b.MIG.Placement):
		return fmt.Sprintf("its MIG placement on GPU %s overlaps that of MIG device %s", gpu, b.Device)
	}
	return ""
}

// mpsInsideMIG is MPSStrategy for a MIG device whose record asks for MPS
// inside it, "" otherwise.
func mpsInsideMIG(pd *checkpoint.PreparedDevice) gpuv1beta1.SharingStrategy {
	if pd.MIG != nil && pd.Sharing != nil && pd.Sharing.Strategy == string(gpuv1beta1.MPSStrategy) {
		return gpuv1beta1.MPSStrategy
	}
	return ""
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
