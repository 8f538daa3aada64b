// Package allocatortest runs the upstream structured allocator — the code
// kube-scheduler runs — over published slices, so tests judge the device
// model the way the scheduler will.
package allocatortest

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// SchedulerFeatures are the allocator features kube-scheduler 1.37 enables
// with default feature gates (see AllocatorFeatures in its
// dynamicresources plugin and the defaults in pkg/features).
var SchedulerFeatures = structured.Features{
	AdminAccess:             true,
	PrioritizedList:         true,
	PartitionableDevices:    true,
	DeviceTaints:            true,
	DeviceBindingAndStatus:  true,
	ConsumableCapacity:      true,
	FractionalCapacityRange: true,
}

// Cluster is the scheduler's view: slices, classes and what earlier claims hold.
type Cluster struct {
	Slices  []*resourceapi.ResourceSlice
	Classes []*resourceapi.DeviceClass
	// Allocated accumulates the allocations of earlier Allocate calls.
	Allocated []*resourceapi.ResourceClaim
	// NodeLabels are the labels of the nodes, by name, that slices' node
	// selectors see (none when absent).
	NodeLabels map[string]map[string]string
	celCache   *cel.Cache
	uid        int
}

// NewCluster starts a cluster view.
func NewCluster(slices []*resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass) *Cluster {
	return &Cluster{
		Slices: slices, Classes: classes,
		celCache: cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}),
	}
}

// Allocate tries to allocate claims on node together, like one pod's
// claims. On success the allocations are recorded (and returned); on
// failure nil is returned and nothing changes.
func (c *Cluster) Allocate(ctx context.Context, node string, claims ...*resourceapi.ResourceClaim) ([]*resourceapi.ResourceClaim, error) {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, claim := range c.Allocated {
		for _, r := range claim.Status.Allocation.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				state.AllocatedDevices.Insert(id)
				continue
			}
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			if r.ConsumedCapacity != nil {
				state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			}
		}
	}
	alloc, err := structured.NewAllocator(ctx, SchedulerFeatures, state, classLister(c.Classes), c.Slices, c.celCache)
	if err != nil {
		return nil, err
	}
	nodeObj := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: c.NodeLabels[node]}}
	for _, claim := range claims {
		if claim.UID == "" {
			c.uid++
			claim.UID = types.UID(fmt.Sprintf("claim-uid-%d", c.uid))
		}
	}
	results, err := alloc.Allocate(ctx, nodeObj, claims)
	if err != nil || results == nil {
		return nil, err
	}
	out := make([]*resourceapi.ResourceClaim, len(claims))
	for i, claim := range claims {
		allocated := claim.DeepCopy()
		allocated.Status.Allocation = &results[i]
		out[i] = allocated
	}
	c.Allocated = append(c.Allocated, out...)
	return out, nil
}

// Release forgets an allocated claim, as when its pod is deleted.
func (c *Cluster) Release(claim *resourceapi.ResourceClaim) {
	for i, a := range c.Allocated {
		if a.UID == claim.UID {
			c.Allocated = append(c.Allocated[:i], c.Allocated[i+1:]...)
			return
		}
	}
}

// MustAllocate fails t unless the claims allocate.
func (c *Cluster) MustAllocate(t testing.TB, node string, claims ...*resourceapi.ResourceClaim) []*resourceapi.ResourceClaim {
	t.Helper()
	out, err := c.Allocate(context.Background(), node, claims...)
	if err != nil {
		t.Fatalf("allocate: %v", err)
	}
	if out == nil {
		t.Fatalf("claims did not fit, expected them to allocate")
	}
	return out
}

// MustNotFit fails t if the claims allocate.
func (c *Cluster) MustNotFit(t testing.TB, node string, claims ...*resourceapi.ResourceClaim) {
	t.Helper()
	out, err := c.Allocate(context.Background(), node, claims...)
	if err != nil {
		t.Fatalf("allocate: %v", err)
	}
	if out != nil {
		t.Fatalf("claims allocated %v, expected them not to fit", Devices(out[0]))
	}
}

// Devices lists the device names allocated to a claim.
func Devices(claim *resourceapi.ResourceClaim) []string {
	var names []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		names = append(names, r.Device)
	}
	return names
}

type classLister []*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) { return l, nil }

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("device class %q not found", name)
}
