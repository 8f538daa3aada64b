package prepare

import (
	"context"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// lockKey serializes work on one physical GPU; devices carved from the same
// GPU share it, devices of other GPUs never wait for it.
func lockKey(p *devicemodel.Published) string { return p.GPU.UUID }

func (d *Engine) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim), "claimUID", claim.UID)
	ctx = klog.NewContext(ctx, logger)
	defer d.claimLocks.Lock(string(claim.UID))()
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim is not allocated")
	}

	// A prepared claim gets what it got, without decoding its config
	// again: a stricter validation after an upgrade must not fail a claim
	// whose containers already run.
	if devices, done, err := d.alreadyPrepared(ctx, claim); done {
		return devices, err
	}

	planned, inputs, keys, err := d.plan(claim)
	if err != nil {
		return nil, err
	}
	unlock := d.locks.lock(keys...)
	defer unlock()

	if devices, done, err := d.alreadyPrepared(ctx, claim); done {
		return devices, err // a concurrent prepare finished first
	}
	d.mu.Lock()
	existing, found := d.cp.Get(claim.UID)
	conflict := d.conflictLocked(claim.UID, planned)
	d.mu.Unlock()
	if found {
		if err := foreignEntry(existing); err != nil {
			return nil, err
		}
	}
	if conflict != nil {
		return nil, conflict
	}
	if found {
		// A preparation that failed half-way and could not be rolled back
		// then: finish the rollback before starting over.
		if err := d.rollback(ctx, existing); err != nil {
			return nil, err
		}
	}

	entry := &checkpoint.PreparedClaim{
		UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name,
		State: checkpoint.PrepareStarted, Devices: planned, Pods: reservedPods(claim),
	}
	if err := d.recordStart(ctx, entry); err != nil {
		return nil, err
	}
	d.fault(FaultPrepareStarted)

	if err := d.prepareDevices(ctx, entry, inputs); err != nil {
		if rbErr := d.rollback(ctx, entry); rbErr != nil {
			logger.Error(rbErr, "Roll back failed preparation")
		}
		return nil, err
	}
	if err := d.writeCDI(ctx, entry); err != nil {
		if rbErr := d.rollback(ctx, entry); rbErr != nil {
			logger.Error(rbErr, "Roll back failed preparation")
		}
		return nil, err
	}
	d.fault(FaultPrepareCDIWritten)
	entry.State = checkpoint.PrepareCompleted
	if err := d.put(ctx, entry); err != nil {
		return nil, err
	}
	d.fault(FaultPrepareCompleted)
	logger.Info("Prepared claim", "devices", deviceNames(entry.Devices))
	return d.kubeletDevices(entry.Devices), nil
}

// recordStart records entry as PrepareStarted: durably when one of its
// devices' work outlives a crash beyond the CDI spec, otherwise in memory
// only, where it reserves the devices. A crash then leaves no record (or
// the one a later save of another claim's change took along): recovery
// removes the orphaned spec, as it does after a durable PrepareStarted.
func (d *Engine) recordStart(ctx context.Context, entry *checkpoint.PreparedClaim) error {
	for i := range entry.Devices {
		if entry.Devices[i].AdminAccess {
			continue // sets nothing up: the spec is all there is
		}
		if h, err := handlerOf(&entry.Devices[i]); err != nil || h.durableStart() {
			return d.put(ctx, entry)
		}
	}
	d.mu.Lock()
	d.cp.Put(cloneClaim(entry))
	d.mu.Unlock()
	return nil
}

// alreadyPrepared returns the recorded result of a completed preparation of
// the claim (done). The claim's allocation must still be the recorded one:
// a claim re-allocated under the same UID would otherwise get its old
// devices.
func (d *Engine) alreadyPrepared(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, bool, error) {
	d.mu.Lock()
	existing, found := d.cp.Get(claim.UID)
	if found {
		existing = cloneClaim(existing)
	}
	d.mu.Unlock()
	if found && !existing.State.Known() {
		return nil, true, foreignEntry(existing)
	}
	if !found || existing.State != checkpoint.PrepareCompleted {
		return nil, false, nil
	}
	recorded, current := recordedAllocation(existing.Devices), d.allocationOf(claim)
	if !slices.Equal(recorded, current) {
		return nil, true, fmt.Errorf("the claim is prepared on this node with devices %v, its allocation now names %v: it must be unprepared before it is prepared with another allocation", recorded, current)
	}
	klog.FromContext(ctx).V(4).Info("Claim already prepared")
	d.recordPods(ctx, existing, claim)
	return d.kubeletDevices(existing.Devices), true, nil
}

// allocatedDevice identifies an allocation result for comparisons and
// messages.
type allocatedDevice struct {
	Request, Pool, Device, ShareID string
}

func (a allocatedDevice) String() string {
	s := a.Request + ":" + a.Pool + "/" + a.Device
	if a.ShareID != "" {
		s += "#" + a.ShareID
	}
	return s
}

// allocationOf lists the claim's allocation results for this driver.
func (d *Engine) allocationOf(claim *resourceapi.ResourceClaim) []allocatedDevice {
	var out []allocatedDevice
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.opts.DriverName {
			continue
		}
		a := allocatedDevice{Request: r.Request, Pool: r.Pool, Device: r.Device}
		if r.ShareID != nil {
			a.ShareID = string(*r.ShareID)
		}
		out = append(out, a)
	}
	return sortedAllocation(out)
}

// recordedAllocation lists the allocation results a record was prepared for.
func recordedAllocation(devices []checkpoint.PreparedDevice) []allocatedDevice {
	out := make([]allocatedDevice, 0, len(devices))
	for _, pd := range devices {
		out = append(out, allocatedDevice{Request: pd.Request, Pool: pd.Pool, Device: pd.Device, ShareID: pd.ShareID})
	}
	return sortedAllocation(out)
}

func sortedAllocation(a []allocatedDevice) []allocatedDevice {
	slices.SortFunc(a, func(x, y allocatedDevice) int { return strings.Compare(x.String(), y.String()) })
	return a
}

// plan maps the claim's allocation results for this driver and pool to the
// devices to prepare, and the GPU locks the preparation needs.
func (d *Engine) plan(claim *resourceapi.ResourceClaim) ([]checkpoint.PreparedDevice, []shareInput, []string, error) {
	var planned []checkpoint.PreparedDevice
	var inputs []shareInput
	var keys []string
	mpsDevices := 0
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.opts.DriverName {
			continue // another driver's device in the same claim
		}
		if clique, ok := vocabulary.ChannelPoolClique(r.Pool); ok {
			pd, err := d.planChannel(claim, r, clique)
			if err != nil {
				return nil, nil, nil, err
			}
			planned = append(planned, pd)
			inputs = append(inputs, shareInput{})
			keys = append(keys, lockIMEX)
			continue
		}
		if r.Pool != d.opts.PoolName {
			return nil, nil, nil, fmt.Errorf("request %q: device %s is in pool %q, this node serves pool %q", r.Request, r.Device, r.Pool, d.opts.PoolName)
		}
		pub, ok := d.devices[r.Device]
		if !ok {
			return nil, nil, nil, fmt.Errorf("request %q: device %q is not published by this node", r.Request, r.Device)
		}
		cfg, err := d.requestConfig(claim, r.Request)
		if err != nil {
			return nil, nil, nil, err
		}
		pd, in, err := plannedDevice(pub, r, cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		if shareStrategy(&pd) == gpuv1beta1.MPSStrategy {
			mpsDevices++
		}
		planned = append(planned, pd)
		inputs = append(inputs, in)
		keys = append(keys, lockKey(pub))
	}
	// A container reaches one MPS daemon through one pipe directory.
	if mpsDevices > 1 {
		return nil, nil, nil, fmt.Errorf("the claim has %d MPS shares; a container can use only one MPS device", mpsDevices)
	}
	return planned, inputs, keys, nil
}

// writeCDI writes the claim's CDI spec and records the returned IDs.
func (d *Engine) writeCDI(ctx context.Context, entry *checkpoint.PreparedClaim) error {
	devices := make([]cdi.ClaimDevice, 0, len(entry.Devices))
	for i, pd := range entry.Devices {
		cd, err := d.containerEdits(pd)
		if err != nil {
			return err
		}
		entry.Devices[i].DeviceNodes = slices.Clone(cd.DeviceNodes)
		devices = append(devices, cd)
	}
	ids, err := d.opts.CDI.WriteClaimSpec(ctx, cdi.ClaimInfo{UID: entry.UID, Namespace: entry.Namespace, Name: entry.Name}, devices)
	if err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	if len(ids) != len(entry.Devices) {
		return fmt.Errorf("write CDI spec: got %d device IDs for %d devices", len(ids), len(entry.Devices))
	}
	for i := range entry.Devices {
		entry.Devices[i].CDIDeviceIDs = []string{ids[i]}
	}
	return nil
}

func (d *Engine) unprepareClaim(ctx context.Context, obj kubeletplugin.NamespacedObject) error {
	defer d.claimLocks.Lock(string(obj.UID))()
	return d.unprepareLocked(ctx, obj)
}

// unprepareLocked unprepares the claim; the caller holds its claim lock.
func (d *Engine) unprepareLocked(ctx context.Context, obj kubeletplugin.NamespacedObject) error {
	logger := klog.FromContext(ctx).WithValues("claim", obj.NamespacedName, "claimUID", obj.UID)
	ctx = klog.NewContext(ctx, logger)

	d.mu.Lock()
	entry, found := d.cp.Get(obj.UID)
	var keys []string
	if found {
		keys = d.lockKeys(entry.Devices)
	}
	d.mu.Unlock()
	if !found {
		// Not prepared, or already unprepared: still make sure no spec
		// is left behind (a crash can separate spec and checkpoint).
		logger.V(4).Info("Claim not prepared, nothing to do")
		return d.opts.CDI.RemoveClaimSpec(ctx, obj.UID)
	}

	unlock := d.locks.lock(keys...)
	defer unlock()
	d.mu.Lock()
	entry, found = d.cp.Get(obj.UID)
	if found {
		entry = cloneClaim(entry)
	}
	d.mu.Unlock()
	if !found {
		return nil // a concurrent unprepare finished first
	}
	if err := foreignEntry(entry); err != nil {
		return err
	}
	if err := d.rollback(ctx, entry); err != nil {
		return err
	}
	logger.Info("Unprepared claim", "devices", deviceNames(entry.Devices))
	return nil
}

// rollback undoes whatever preparation of entry got done, in reverse order,
// and forgets the claim. Each step is idempotent, so a rollback interrupted
// by a crash is simply run again. The caller holds the entry's GPU locks.
func (d *Engine) rollback(ctx context.Context, entry *checkpoint.PreparedClaim) error {
	if entry.State == checkpoint.PrepareCompleted {
		// Mark the claim as going away first: a crash from here on must
		// finish the undo on restart, not trust a half-removed claim.
		entry.State = checkpoint.UnprepareStarted
		if err := d.put(ctx, entry); err != nil {
			return err
		}
		d.fault(FaultUnprepareStarted)
	}
	if err := d.opts.CDI.RemoveClaimSpec(ctx, entry.UID); err != nil {
		return fmt.Errorf("remove CDI spec: %w", err)
	}
	d.fault(FaultUnprepareCDIGone)
	if err := d.unprepareDevices(ctx, entry); err != nil {
		return err
	}
	if err := d.remove(ctx, entry.UID); err != nil {
		return err
	}
	d.fault(FaultUnprepareDone)
	return nil
}

func (d *Engine) lockKeys(devices []checkpoint.PreparedDevice) []string {
	keys := make([]string, 0, len(devices))
	for _, pd := range devices {
		keys = append(keys, gpuUUIDOf(pd))
	}
	return keys
}

// kubeletDevices are the devices of a prepared claim as the kubelet gets
// them, with their metadata (metadata.go).
func (d *Engine) kubeletDevices(devices []checkpoint.PreparedDevice) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(devices))
	for _, pd := range devices {
		kd := kubeletplugin.Device{
			Requests:     []string{pd.Request},
			PoolName:     pd.Pool,
			DeviceName:   pd.Device,
			CDIDeviceIDs: slices.Clone(pd.CDIDeviceIDs),
			Metadata:     d.deviceMetadata(pd),
		}
		if pd.ShareID != "" {
			id := types.UID(pd.ShareID)
			kd.ShareID = &id
		}
		out = append(out, kd)
	}
	return out
}

func deviceNames(devices []checkpoint.PreparedDevice) []string {
	names := make([]string, 0, len(devices))
	for _, pd := range devices {
		names = append(names, pd.Device)
	}
	return names
}

func cloneClaim(c *checkpoint.PreparedClaim) *checkpoint.PreparedClaim {
	cc := *c
	cc.Pods = slices.Clone(c.Pods)
	cc.Devices = make([]checkpoint.PreparedDevice, len(c.Devices))
	for i, pd := range c.Devices {
		pd.UUIDs = slices.Clone(pd.UUIDs)
		pd.CDIDeviceIDs = slices.Clone(pd.CDIDeviceIDs)
		if pd.MIG != nil {
			m := *pd.MIG
			pd.MIG = &m
		}
		if pd.IMEXChannel != nil {
			c := *pd.IMEXChannel
			pd.IMEXChannel = &c
		}
		if pd.Sharing != nil {
			s := *pd.Sharing
			s.Config = slices.Clone(s.Config)
			pd.Sharing = &s
		}
		cc.Devices[i] = pd
	}
	return &cc
}

// reservedPods lists the pods the claim is reserved for, so that a stale
// release can tell whether one of them still runs here.
func reservedPods(claim *resourceapi.ResourceClaim) []checkpoint.ReservedPod {
	var pods []checkpoint.ReservedPod
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			pods = append(pods, checkpoint.ReservedPod{Name: r.Name, UID: r.UID})
		}
	}
	return pods
}

// recordPods adds the pods a prepared claim is now also reserved for (a
// claim shared by pods started one after the other). A failed save only
// loses this evidence; the kubelet and NVML still vouch for those pods.
func (d *Engine) recordPods(ctx context.Context, existing *checkpoint.PreparedClaim, claim *resourceapi.ResourceClaim) {
	added := false
	for _, p := range reservedPods(claim) {
		if !slices.Contains(existing.Pods, p) {
			existing.Pods, added = append(existing.Pods, p), true
		}
	}
	if !added {
		return
	}
	if err := d.put(ctx, existing); err != nil {
		klog.FromContext(ctx).Error(err, "Record the pods of a prepared claim")
	}
}
