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

// A GPU bound to vfio-pci is recorded in the checkpoint (the binding
// intent) and, once written, in the claim's CDI spec. Between binding and
// the spec only the checkpoint knows it: lost or corrupt then, the GPU
// would stay on vfio-pci for ever, out of NVML. So, as for MIG instances
// (migintent.go), each binding also gets an intent file beside the
// checkpoint, written before the GPU moves and removed after it is back on
// nvidia. An intent no checkpoint entry accounts for at start names a GPU
// to give back.

func (d *Engine) vfioIntentDir() string {
	return filepath.Join(filepath.Dir(d.opts.CheckpointPath), "vfio-intents")
}

// vfioIntent is the content of an intent file.
type vfioIntent struct {
	ClaimUID  types.UID `json:"claimUID"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Device    string    `json:"device"`
	PCIBusID  string    `json:"pciBusID"`
}

func (d *Engine) vfioIntentPath(uid types.UID, pciBusID string) string {
	return filepath.Join(d.vfioIntentDir(), fmt.Sprintf("%s_%s.json", uid, pciBusID))
}

// recordVFIOIntent durably records that the driver is about to bind pd's
// GPU to vfio-pci for the claim.
func (d *Engine) recordVFIOIntent(entry *checkpoint.PreparedClaim, pd *checkpoint.PreparedDevice) error {
	return writeIntent(d.vfioIntentDir(), d.vfioIntentPath(entry.UID, pd.VFIOPCIBusID), "passthrough", pd.Device,
		vfioIntent{ClaimUID: entry.UID, Namespace: entry.Namespace, Name: entry.Name, Device: pd.Device, PCIBusID: pd.VFIOPCIBusID})
}

// forgetVFIOIntent removes the intent of a GPU back on nvidia.
func (d *Engine) forgetVFIOIntent(uid types.UID, pciBusID string) error {
	return removeIntent(d.vfioIntentPath(uid, pciBusID), "passthrough")
}

// giveBackLeakedVFIO binds the GPUs of intents no checkpoint entry
// accounts for back to nvidia, and removes those intents; a GPU another
// entry holds for passthrough is left alone. A failure keeps the intent
// for the next start.
func (d *Engine) giveBackLeakedVFIO(ctx context.Context) {
	logger := klog.FromContext(ctx)
	forEachIntent(ctx, d.vfioIntentDir(), "passthrough", func(path string, data []byte) {
		var intent vfioIntent
		if err := json.Unmarshal(data, &intent); err != nil {
			logger.Error(err, "Ignoring unreadable passthrough intent", "path", path)
			return
		}
		holder, held := d.vfioHolder(intent.PCIBusID)
		if held && holder == intent.ClaimUID {
			return
		}
		if !held {
			if d.opts.Passthrough == nil {
				return
			}
			logger.Info("Binding a GPU back to nvidia that no claim holds (its record was lost)",
				"claim", klog.KRef(intent.Namespace, intent.Name), "claimUID", intent.ClaimUID, "device", intent.Device, "pciBusID", intent.PCIBusID)
			if err := d.opts.Passthrough.Give(ctx, intent.PCIBusID); err != nil {
				logger.Error(err, "Cannot bind the GPU back to nvidia; retrying at the next start", "pciBusID", intent.PCIBusID)
				return
			}
		}
		if err := atomicfile.Remove(path); err != nil {
			logger.Error(err, "Cannot remove passthrough intent", "path", path)
		}
	})
}

// vfioHolder is the claim whose entry holds the GPU at pciBusID for
// passthrough.
func (d *Engine) vfioHolder(pciBusID string) (types.UID, bool) {
	for uid, entry := range d.cp.All() {
		for _, pd := range entry.Devices {
			if pd.VFIOPCIBusID == pciBusID && !pd.AdminAccess {
				return uid, true
			}
		}
	}
	return "", false
}
