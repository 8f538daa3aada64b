package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// recover brings the node back to a state the checkpoint describes, after a
// restart at any point of a previous run:
//   - a claim left in PrepareStarted is rolled back (the kubelet retries
//     the prepare, which then starts clean);
//   - a CDI spec without a completed claim is an orphan and is removed;
//   - a corrupt or missing checkpoint is rebuilt from the CDI specs, which
//     carry each claim's devices in their annotations.
//
// Each step is safe to interrupt: a crash at any fault point leaves a state
// that the next start recovers the same way. In particular a spec is never
// removed unless a trusted checkpoint file positively says its claim is not
// prepared: a rebuilt checkpoint is saved before anything is removed.
func (d *Engine) recover(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	// A write of a spec interrupted by the crash left a temporary file,
	// which no runtime reads; its claim has no record, or one recovery
	// deals with below (a whole GPU's PrepareStarted is not saved).
	if err := d.opts.CDI.RemoveTemps(ctx); err != nil {
		logger.Error(err, "Cannot remove temporary CDI spec files; they are never read")
	}
	specs, err := d.opts.CDI.ListClaimSpecs(ctx)
	if err != nil {
		return fmt.Errorf("list CDI specs: %w", err)
	}
	cp, err := d.loadOrRebuild(ctx, specs)
	if err != nil {
		return err
	}
	d.cp = cp

	for _, entry := range d.cp.All() {
		if err := foreignEntry(entry); err != nil {
			d.reportProblem(ctx, entry, err)
			continue
		}
		if entry.State == checkpoint.PrepareCompleted {
			continue
		}
		entry := cloneClaim(entry)
		logger.Info("Rolling back a preparation interrupted by a restart", "claim", klog.KRef(entry.Namespace, entry.Name), "claimUID", entry.UID)
		if err := d.rollback(ctx, entry); err != nil {
			// One GPU that cannot be reached (lost, in reset) must not
			// stop the node: the other GPUs are served, the entry
			// stays for the kubelet's retries of this claim.
			d.reportProblem(ctx, entry, fmt.Errorf("roll back: %w", err))
			continue
		}
		d.fault(FaultRecoverRolledBack)
	}
	d.destroyLeakedMIG(ctx)
	d.giveBackLeakedVFIO(ctx)
	haveSpec := map[types.UID]bool{}
	for _, spec := range specs {
		entry, ok := d.cp.Get(spec.Claim.UID)
		if ok && foreignEntry(entry) != nil {
			haveSpec[spec.Claim.UID] = true // not this release's to fix
			continue
		}
		if ok && entry.State == checkpoint.PrepareCompleted {
			haveSpec[spec.Claim.UID] = spec.Err == nil
			continue
		}
		logger.Info("Removing orphaned CDI spec", "claimUID", spec.Claim.UID)
		if err := d.opts.CDI.RemoveClaimSpec(ctx, spec.Claim.UID); err != nil {
			return fmt.Errorf("remove orphaned CDI spec of claim %s: %w", spec.Claim.UID, err)
		}
		d.fault(FaultRecoverOrphanRemoved)
	}
	d.missingSpecs = nil
	for uid, entry := range d.cp.All() {
		// Only a completed claim has a spec: one left in another state
		// (its rollback failed, the GPU is lost) is retried by the kubelet.
		if !haveSpec[uid] && foreignEntry(entry) == nil && entry.State == checkpoint.PrepareCompleted {
			d.missingSpecs = append(d.missingSpecs, uid)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.save(ctx)
}

// loadOrRebuild loads the checkpoint. A corrupt one is copied aside and a
// missing one (deleted, or lost with its directory) while claim specs exist
// is not "nothing prepared": both are rebuilt from the specs, and the rebuilt
// checkpoint is saved (replacing the corrupt file atomically) before the
// caller acts on it.
func (d *Engine) loadOrRebuild(ctx context.Context, specs []cdi.ClaimSpecInfo) (*checkpoint.Checkpoint, error) {
	logger := klog.FromContext(ctx)
	exists, err := checkpoint.Exists(d.opts.CheckpointPath)
	if err != nil {
		return nil, err
	}
	cp, err := d.store.Load(ctx)
	switch {
	case errors.Is(err, checkpoint.ErrCorrupt):
		kept, qerr := checkpoint.Quarantine(d.opts.CheckpointPath)
		if qerr != nil {
			return nil, fmt.Errorf("%w; copying it aside also failed: %w", err, qerr)
		}
		logger.Error(err, "Checkpoint is corrupt: copied it aside and rebuilding prepared claims from CDI specs", "copiedTo", kept)
		d.fault(FaultRecoverCorruptCopied)
	case err != nil:
		return nil, fmt.Errorf("load checkpoint: %w", err)
	case exists || !hasReadableSpec(specs):
		return cp, nil
	default:
		logger.Error(nil, "Checkpoint file is missing but CDI specs of prepared claims exist: rebuilding prepared claims from them", "path", d.opts.CheckpointPath)
	}
	cp = rebuildFromSpecs(specs)
	if err := d.store.Save(ctx, cp); err != nil {
		return nil, fmt.Errorf("save checkpoint rebuilt from CDI specs: %w", err)
	}
	d.fault(FaultRecoverRebuiltSaved)
	return cp, nil
}

// foreignEntry says why an entry is left untouched by this release: a newer
// release wrote it, in a state or with a device kind this one does not
// know, so rolling it back, or rewriting its spec, could undo the wrong
// things or miss what it holds. Its devices stay reserved (see
// physicalConflict) until a release that knows it deals with it.
func foreignEntry(entry *checkpoint.PreparedClaim) error {
	if !entry.State.Known() {
		return fmt.Errorf("claim %s/%s is recorded in state %q, which this release does not know (a newer release prepared it): leaving it untouched", entry.Namespace, entry.Name, entry.State)
	}
	for _, pd := range entry.Devices {
		if !knownKind(pd.Kind) {
			return fmt.Errorf("claim %s/%s holds device %s of kind %q, which this release does not know (a newer release prepared it): leaving it untouched", entry.Namespace, entry.Name, pd.Device, pd.Kind)
		}
	}
	return nil
}

// reportProblem records that the claim's entry is kept as it is because
// recovery could not deal with it; the kubelet's next prepare or unprepare
// of the claim tries again.
func (d *Engine) reportProblem(ctx context.Context, entry *checkpoint.PreparedClaim, err error) {
	klog.FromContext(ctx).Error(err, "Cannot recover claim at start; keeping its checkpoint entry for a retry and serving the other claims",
		"claim", klog.KRef(entry.Namespace, entry.Name), "claimUID", entry.UID, "state", entry.State, "devices", deviceNames(entry.Devices))
	if d.opts.Metrics != nil {
		d.opts.Metrics.ObserveError(operationRecover, reasonUnrecovered)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.problems[entry.UID] = err.Error()
}

// Labels of DriverMetrics.Errors for claims recovery left as they were.
const (
	operationRecover  = "recover"
	reasonUnrecovered = "unrecovered_claim"
	reasonMIGLeak     = "leaked_mig"
)

// RecoveryProblems returns the claims whose checkpoint entries recovery
// kept unchanged at start, with the reason; an entry leaves the list once a
// later prepare or unprepare of its claim succeeds.
func (d *Engine) RecoveryProblems() map[types.UID]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.problems)
}

func hasReadableSpec(specs []cdi.ClaimSpecInfo) bool {
	for _, s := range specs {
		if s.Err == nil {
			return true
		}
	}
	return false
}

// rewriteMissingSpecs writes again the spec of a prepared claim whose spec
// vanished (removed by hand, unreadable): without it the claim's containers
// cannot start. It needs the published devices, so it runs in SetDevices.
func (d *Engine) rewriteMissingSpecs(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, uid := range d.missingSpecs {
		d.mu.Lock()
		entry, ok := d.cp.Get(uid)
		if ok {
			entry = cloneClaim(entry)
		}
		d.mu.Unlock()
		if !ok {
			continue
		}
		logger.Info("Rewriting missing CDI spec of a prepared claim", "claim", klog.KRef(entry.Namespace, entry.Name), "claimUID", uid)
		if err := d.writeCDI(ctx, entry); err != nil {
			// Not fatal: the plugin must keep serving the other claims.
			logger.Error(err, "Cannot rewrite CDI spec; containers of this claim cannot start until it is unprepared", "claim", klog.KRef(entry.Namespace, entry.Name))
			continue
		}
		if err := d.put(ctx, entry); err != nil {
			logger.Error(err, "Record rewritten CDI spec")
		}
	}
	d.missingSpecs = nil
}

// rebuildFromSpecs recreates completed claims from the annotations of the
// CDI specs on disk: a spec is written only once a claim's devices exist, and
// removed before they are released. Unreadable specs are left out, and so
// end up removed as orphans.
func rebuildFromSpecs(specs []cdi.ClaimSpecInfo) *checkpoint.Checkpoint {
	cp := checkpoint.New()
	for _, spec := range specs {
		if spec.Err != nil {
			continue
		}
		entry := &checkpoint.PreparedClaim{
			UID: spec.Claim.UID, Namespace: spec.Claim.Namespace, Name: spec.Claim.Name,
			State: checkpoint.PrepareCompleted,
		}
		for _, dev := range spec.Devices {
			pd := checkpoint.PreparedDevice{
				Request: dev.Request, Pool: dev.Pool, Device: dev.Device, ShareID: dev.ShareID,
				Kind: dev.Kind, UUIDs: dev.UUIDs, CDIDeviceIDs: []string{dev.ID},
			}
			if data, ok := dev.Annotations[annotationMIG]; ok {
				var m checkpoint.MigInstance
				if err := json.Unmarshal([]byte(data), &m); err == nil {
					pd.MIG = &m
				}
			}
			if data, ok := dev.Annotations[annotationSharing]; ok {
				var sh checkpoint.Sharing
				if err := json.Unmarshal([]byte(data), &sh); err == nil {
					pd.Sharing = &sh
				}
			}
			if data, ok := dev.Annotations[annotationIMEXChannel]; ok {
				var c checkpoint.IMEXChannel
				if err := json.Unmarshal([]byte(data), &c); err == nil {
					pd.IMEXChannel = &c
				}
			}
			pd.GPUUUID = dev.Annotations[annotationGPU]
			pd.AdminAccess = dev.Annotations[annotationAdminAccess] == "true"
			pd.VFIOPCIBusID = dev.Annotations[annotationVFIO]
			if nodes := dev.Annotations[annotationDeviceNodes]; nodes != "" {
				pd.DeviceNodes = strings.Split(nodes, ",")
			}
			if pd.GPUUUID == "" && (pd.MIG != nil || len(pd.UUIDs) > 0) {
				// A spec of an older release: MIG parent, or the GPU itself.
				pd.GPUUUID = gpuUUIDOf(pd)
			}
			entry.Devices = append(entry.Devices, pd)
		}
		cp.Put(entry)
	}
	return cp
}
