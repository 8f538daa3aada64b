package prepare

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// A MIG instance the driver creates is recorded in the checkpoint, and in
// the claim's CDI spec once that is written. Between the two, and again
// between removing the spec and destroying the instance at unprepare, only
// the checkpoint knows it: if the checkpoint is then lost or corrupt, the
// instance would be published as a static MIG device for ever. So each one
// also gets an intent file, independent of the checkpoint, written before
// the instance is created and removed after it is destroyed. An intent that
// no checkpoint entry accounts for at start names a leaked instance.

// migIntentDir is the directory of the intent files, beside the checkpoint.
func (d *Engine) migIntentDir() string {
	return filepath.Join(filepath.Dir(d.opts.CheckpointPath), "mig-intents")
}

// migIntent is the content of an intent file.
type migIntent struct {
	ClaimUID  types.UID              `json:"claimUID"`
	Namespace string                 `json:"namespace"`
	Name      string                 `json:"name"`
	Device    string                 `json:"device"`
	MIG       checkpoint.MigInstance `json:"mig"`
}

func (d *Engine) migIntentPath(uid types.UID, m *checkpoint.MigInstance) string {
	name := fmt.Sprintf("%s_%s_%d_%d-%d.json", uid, m.ParentUUID, m.GIProfileID, m.Placement.Start, m.Placement.Size)
	return filepath.Join(d.migIntentDir(), name)
}

// recordMIGIntent durably records that the driver is about to create the
// MIG instance of pd for the claim.
func (d *Engine) recordMIGIntent(entry *checkpoint.PreparedClaim, pd *checkpoint.PreparedDevice) error {
	return writeIntent(d.migIntentDir(), d.migIntentPath(entry.UID, pd.MIG), "MIG", pd.Device,
		migIntent{ClaimUID: entry.UID, Namespace: entry.Namespace, Name: entry.Name, Device: pd.Device, MIG: *pd.MIG})
}

// forgetMIGIntent removes the intent of an instance that is destroyed.
func (d *Engine) forgetMIGIntent(uid types.UID, m *checkpoint.MigInstance) error {
	return removeIntent(d.migIntentPath(uid, m), "MIG")
}

// destroyLeakedMIG destroys the instances of intents that no checkpoint
// entry accounts for, and removes those intents. An instance at the same
// place that another entry holds is left alone (a release that does not
// write intents may have created it). A failure (the GPU is lost) keeps
// the intent for the next start and does not stop this one.
func (d *Engine) destroyLeakedMIG(ctx context.Context) {
	logger := klog.FromContext(ctx)
	forEachIntent(ctx, d.migIntentDir(), "MIG", func(path string, data []byte) {
		var intent migIntent
		if err := json.Unmarshal(data, &intent); err != nil {
			// Written atomically, so never half-written: not ours.
			logger.Error(err, "Ignoring unreadable MIG intent", "path", path)
			return
		}
		if d.accountsForMIG(intent) {
			return
		}
		m := intent.MIG
		if !d.migHeldByAnyone(&m) {
			logger.Info("Destroying a MIG instance the driver created that no claim holds (its record was lost)",
				"claim", klog.KRef(intent.Namespace, intent.Name), "claimUID", intent.ClaimUID, "device", intent.Device, "gpu", m.ParentUUID)
			if err := d.destroyMIG(ctx, &m); err != nil {
				logger.Error(err, "Cannot destroy leaked MIG instance; retrying at the next start", "device", intent.Device, "gpu", m.ParentUUID)
				if d.opts.Metrics != nil {
					d.opts.Metrics.ObserveError(operationRecover, reasonMIGLeak)
				}
				return
			}
			d.fault(FaultRecoverLeakedMIGDestroyed)
		}
		if err := atomicfile.Remove(path); err != nil {
			logger.Error(err, "Cannot remove MIG intent", "path", path)
		}
	})
}

// accountsForMIG reports whether the intent's claim entry holds its
// instance.
func (d *Engine) accountsForMIG(intent migIntent) bool {
	entry, ok := d.cp.Get(intent.ClaimUID)
	if !ok {
		return false
	}
	for _, pd := range entry.Devices {
		if pd.MIG != nil && sameMIGPlace(pd.MIG, &intent.MIG) {
			return true
		}
	}
	return false
}

// migHeldByAnyone reports whether any entry holds an instance at m's place
// (admin access to it holds nothing).
func (d *Engine) migHeldByAnyone(m *checkpoint.MigInstance) bool {
	for _, entry := range d.cp.All() {
		for _, pd := range entry.Devices {
			if pd.MIG != nil && !pd.AdminAccess && sameMIGPlace(pd.MIG, m) {
				return true
			}
		}
	}
	return false
}

func sameMIGPlace(a, b *checkpoint.MigInstance) bool {
	return a.ParentUUID == b.ParentUUID && a.GIProfileID == b.GIProfileID && a.Placement == b.Placement
}
