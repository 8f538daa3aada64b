package prepare

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// Admin access (allocation results with adminAccess: true) is how
// Kubernetes hands a device to monitoring and management beside whoever
// holds it: the scheduler does not count such a result as an allocation,
// and only namespaces labelled resource.kubernetes.io/admin-access=true may
// ask for it (the API server enforces that). So the driver takes nothing
// for such a device: it conflicts with no claim, sets nothing up (no MIG
// mode change, no MIG instance, no time-slice or MPS daemon), is undone by
// removing its CDI spec alone, and withdraws nothing from the published
// devices. The container gets the device's nodes and UUIDs like any claim.

// planAdmin is plannedDevice for an admin-access result: the handler's
// plan without a config (admin access applies none: it sets nothing up),
// and a dynamic MIG device's instance marked as not the claim's own, so
// nothing (rollback, recovery, leak clean-up) ever destroys it for this
// claim. The instance is looked up at prepare.
func planAdmin(h kindHandler, pub *devicemodel.Published, r resourceapi.DeviceRequestAllocationResult, pd *checkpoint.PreparedDevice) error {
	pd.AdminAccess = true
	if _, err := h.plan(pub, r, nil, pd); err != nil {
		return err
	}
	if pd.MIG != nil {
		pd.MIG.CreatedByDriver = false
	}
	return nil
}

// isAdmin reports whether an allocation result asks for admin access.
func isAdmin(r resourceapi.DeviceRequestAllocationResult) bool {
	return ptr.Deref(r.AdminAccess, false)
}

// prepareAdmin completes the record of an admin-access device; nothing on
// the node changes. A dynamic MIG device exists only while a claim holds
// it: admin access gets that claim's instance, and is refused while there
// is none (creating one would take the placement from the tenants). The
// caller holds the GPU's lock, so the holder's instance cannot come or go
// meanwhile.
func (d *Engine) prepareAdmin(ctx context.Context, pd *checkpoint.PreparedDevice) error {
	if pd.MIG == nil || len(pd.UUIDs) > 0 {
		return nil // a whole GPU, a share's GPU, or a static MIG device
	}
	d.mu.Lock()
	held, ok := d.heldMIG(pd.MIG)
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("device %s: admin access to a MIG device that no claim on this node holds: its MIG instance does not exist, and admin access does not create one", pd.Device)
	}
	pd.MIG.GIID, pd.MIG.CIID = held.MIG.GIID, held.MIG.CIID
	pd.UUIDs = []string{held.UUIDs[0]}
	klog.FromContext(ctx).V(2).Info("Admin access to the MIG instance of another claim", "device", pd.Device, "uuid", pd.UUIDs[0])
	return nil
}

// heldMIG is a copy of a non-admin device whose MIG instance at m's place
// exists. Caller holds d.mu.
func (d *Engine) heldMIG(m *checkpoint.MigInstance) (checkpoint.PreparedDevice, bool) {
	for _, entry := range d.cp.All() {
		for _, pd := range entry.Devices {
			if !pd.AdminAccess && pd.MIG != nil && len(pd.UUIDs) > 0 && sameMIGPlace(pd.MIG, m) {
				return pd, true
			}
		}
	}
	return checkpoint.PreparedDevice{}, false
}
