// Package checkpoint is the kubelet plugin's crash-safe record of prepared
// ResourceClaims: which claims it prepared on this node, with which devices,
// MIG instances and sharing set-ups, and how far each preparation got.
//
// The record is a single versioned JSON file (see docs/checkpoint.md). Fields
// are only ever added within a major format version, and readers ignore
// fields they do not know, so a plugin can read the checkpoint written by the
// previous and by the next release.
package checkpoint

import (
	"encoding/json"
	"iter"
	"maps"
	"slices"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"

	"k8s.io/apimachinery/pkg/types"
)

// ClaimState says how far the preparation of a claim got.
type ClaimState string

const (
	// PrepareStarted is recorded before the plugin changes anything on the
	// node for a claim (creates MIG instances, starts sharing daemons, writes
	// the CDI spec). Finding a claim in this state after a restart means the
	// preparation may have been interrupted half-way: the plugin must undo or
	// redo it, using the recorded devices to find what it may have created.
	PrepareStarted ClaimState = "PrepareStarted"
	// PrepareCompleted is recorded once everything for the claim exists and
	// its CDI device IDs were returned to the kubelet.
	PrepareCompleted ClaimState = "PrepareCompleted"
	// UnprepareStarted is recorded before the plugin starts undoing a
	// claim's preparation. Finding a claim in this state after a restart
	// means the undo was interrupted: the plugin finishes it.
	UnprepareStarted ClaimState = "UnprepareStarted"
)

// Known reports whether s is one of the states this release knows. A newer
// release may add states; an entry in one of them must be left alone.
func (s ClaimState) Known() bool {
	switch s {
	case PrepareStarted, PrepareCompleted, UnprepareStarted:
		return true
	}
	return false
}

// PreparedClaim is the record of one claim prepared on this node.
type PreparedClaim struct {
	// UID is the ResourceClaim's UID; the checkpoint is keyed by it.
	UID types.UID `json:"uid"`
	// Namespace and Name identify the ResourceClaim for logs and operators.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// State is how far the preparation got.
	State ClaimState `json:"state"`
	// Devices are the allocated devices the plugin prepared (or started to
	// prepare) for the claim, in allocation result order.
	Devices []PreparedDevice `json:"devices,omitempty"`
	// Pods are the pods the claim was reserved for when it was prepared
	// (its status.reservedFor), in the claim's namespace: while one of them
	// runs on this node, the claim is never released as stale
	// (pkg/staleclaims). Checkpoints of older releases have none.
	Pods []ReservedPod `json:"pods,omitempty"`
	// Unknown are fields of a newer release, kept as they are.
	Unknown Unknown `json:"-"`
}

// ReservedPod is a pod a prepared claim was reserved for.
type ReservedPod struct {
	Name string    `json:"name"`
	UID  types.UID `json:"uid"`
}

// PreparedDevice is one allocated device of a prepared claim.
type PreparedDevice struct {
	// Request, Pool and Device are copied from the claim's allocation result.
	Request string `json:"request"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	// ShareID is the allocation result's share ID for devices allocated with
	// consumable capacity; empty otherwise.
	ShareID string `json:"shareID,omitempty"`
	// Kind says what the device is. It stays free-form (any string) so that
	// later releases can add kinds without changing the format; a kind this
	// release does not know is left alone.
	Kind vocabulary.Kind `json:"kind"`
	// GPUUUID is the physical GPU the device is, or is carved from.
	GPUUUID string `json:"gpuUUID,omitempty"`
	// UUIDs are the NVIDIA UUIDs (GPU-… or MIG-…) the container gets.
	UUIDs []string `json:"uuids,omitempty"`
	// CDIDeviceIDs are the fully qualified CDI device IDs returned to the
	// kubelet for this device.
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	// DeviceNodes are the device nodes the claim's CDI spec gives the
	// container for this device (the GPU's node, MIG capability nodes), so
	// the spec can be written again while the GPU cannot be reached.
	DeviceNodes []string `json:"deviceNodes,omitempty"`
	// AdminAccess is the allocation result's adminAccess: the claim uses
	// the device beside whoever holds it (monitoring), so the device
	// conflicts with nothing and its preparation changed nothing on the
	// node but the CDI spec. Absent in older checkpoints, which never
	// prepared a device that way.
	AdminAccess bool `json:"adminAccess,omitempty"`
	// MIG describes the MIG instance behind a vocabulary.KindMIG device.
	MIG *MigInstance `json:"mig,omitempty"`
	// Sharing describes how the device is shared, if it is.
	Sharing *Sharing `json:"sharing,omitempty"`
	// VFIOPCIBusID is the PCI device of a vocabulary.KindVFIO device,
	// recorded before it is bound to vfio-pci: the binding intent a
	// restart follows to give the GPU back to nvidia.
	VFIOPCIBusID string `json:"vfioPCIBusID,omitempty"`
	// IMEXChannel describes a vocabulary.KindIMEXChannel device: the
	// channel and the compute domain whose IMEX daemon it holds.
	IMEXChannel *IMEXChannel `json:"imexChannel,omitempty"`
	// Unknown are fields of a newer release, kept as they are.
	Unknown Unknown `json:"-"`
}

// IMEXChannel is the record of a compute domain's IMEX channel prepared on
// this node: the channel the containers get, and the domain (a
// ComputeDomain in the claim's namespace) whose IMEX daemon the claim
// holds. DomainUID is empty until the domain was looked up; a record with
// it set may hold the daemon and its status entry, which unprepare and
// recovery release.
type IMEXChannel struct {
	Channel         int    `json:"channel"`
	DomainNamespace string `json:"domainNamespace"`
	DomainName      string `json:"domainName"`
	DomainUID       string `json:"domainUID,omitempty"`
	// Unknown are fields of a newer release, kept as they are.
	Unknown Unknown `json:"-"`
}

// MigInstance identifies a MIG GPU instance and compute instance well enough
// to find it again, and to delete it, after a restart.
type MigInstance struct {
	// ParentUUID is the UUID of the physical GPU.
	ParentUUID string `json:"parentUUID"`
	// GIProfileID is the NVML GPU instance profile ID.
	GIProfileID uint32 `json:"giProfileID"`
	// Placement is where the GPU instance sits on the parent GPU.
	Placement MigPlacement `json:"placement"`
	// GIID and CIID are the NVML GPU instance and compute instance IDs.
	GIID uint32 `json:"giID"`
	CIID uint32 `json:"ciID"`
	// CreatedByDriver is true when this plugin created the instance (and so
	// must delete it on unprepare); false when it already existed.
	CreatedByDriver bool `json:"createdByDriver"`
	// Unknown are fields of a newer release, kept as they are.
	Unknown Unknown `json:"-"`
}

// MigPlacement is a GPU instance placement: the first memory slice and the
// number of slices.
type MigPlacement struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

// Sharing records how a device is shared between containers.
type Sharing struct {
	// Strategy names the sharing strategy, for example "TimeSlicing" or "MPS".
	Strategy string `json:"strategy"`
	// Config holds strategy-specific details (for example the MPS control
	// daemon's pipe directory). Its layout belongs to the sharing code; the
	// checkpoint stores it verbatim.
	Config json.RawMessage `json:"config,omitempty"`
	// Unknown are fields of a newer release, kept as they are.
	Unknown Unknown `json:"-"`
}

// Checkpoint is the set of claims prepared on this node. The zero value is an
// empty checkpoint ready to use.
type Checkpoint struct {
	// Claims maps claim UIDs to their records.
	Claims map[types.UID]*PreparedClaim `json:"claims"`
	// Unknown are fields of a newer release, kept as they are.
	Unknown Unknown `json:"-"`
}

// New returns an empty checkpoint.
func New() *Checkpoint {
	return &Checkpoint{Claims: map[types.UID]*PreparedClaim{}}
}

// Get returns the record of the claim with the given UID.
func (c *Checkpoint) Get(uid types.UID) (*PreparedClaim, bool) {
	claim, ok := c.Claims[uid]
	return claim, ok
}

// Put adds or replaces the record of claim.UID.
func (c *Checkpoint) Put(claim *PreparedClaim) {
	if c.Claims == nil {
		c.Claims = map[types.UID]*PreparedClaim{}
	}
	c.Claims[claim.UID] = claim
}

// Delete removes the record of the claim with the given UID, if any.
func (c *Checkpoint) Delete(uid types.UID) {
	delete(c.Claims, uid)
}

// Len returns the number of recorded claims.
func (c *Checkpoint) Len() int {
	return len(c.Claims)
}

// All iterates over the recorded claims in UID order, so that logs and
// reconciliation are deterministic. The checkpoint must not be modified
// during the iteration.
func (c *Checkpoint) All() iter.Seq2[types.UID, *PreparedClaim] {
	return func(yield func(types.UID, *PreparedClaim) bool) {
		for _, uid := range slices.Sorted(maps.Keys(c.Claims)) {
			if !yield(uid, c.Claims[uid]) {
				return
			}
		}
	}
}

// OwnsMIG reports whether a recorded claim holds a MIG GPU instance the
// driver created on the given GPU.
func (c *Checkpoint) OwnsMIG(parentUUID string, giID uint32) bool {
	for _, claim := range c.Claims {
		for _, pd := range claim.Devices {
			if pd.MIG != nil && pd.MIG.CreatedByDriver && pd.MIG.ParentUUID == parentUUID && pd.MIG.GIID == giID {
				return true
			}
		}
	}
	return false
}
