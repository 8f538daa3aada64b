package reserve

import (
	"context"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Allocations follows the devices of one pool that allocated
// ResourceClaims hold, through an informer on every ResourceClaim (the API
// has no field selector on a claim's allocation).
type Allocations struct {
	driver, pool string
	changed      chan struct{}
	synced       cache.InformerSynced

	mu sync.Mutex
	// byClaim are the pool's devices each allocated claim holds.
	byClaim map[types.UID][]string
}

// WatchAllocations starts following the allocations of driver's pool
// until ctx ends.
func WatchAllocations(ctx context.Context, client kubernetes.Interface, driver, pool string) *Allocations {
	a := NewAllocations(driver, pool)
	factory := informers.NewSharedInformerFactory(client, 0)
	informer := factory.Resource().V1().ResourceClaims().Informer()
	// Only the allocation matters: keep no spec, no managed fields.
	if err := informer.SetTransform(stripClaim); err != nil {
		klog.FromContext(ctx).Error(err, "ResourceClaim informer keeps whole claims")
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.Set(obj) },
		UpdateFunc: func(_, obj any) { a.Set(obj) },
		DeleteFunc: a.Delete,
	}); err != nil {
		klog.FromContext(ctx).Error(err, "ResourceClaim informer has no handler; the reserve policy follows prepares only")
	}
	a.synced = informer.HasSynced
	factory.Start(ctx.Done())
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			a.signal() // the tracker's start hold begins
		}
	}()
	return a
}

// NewAllocations is an empty record of the pool's allocations, fed by Set
// and Delete.
func NewAllocations(driver, pool string) *Allocations {
	return &Allocations{driver: driver, pool: pool, changed: make(chan struct{}, 1), byClaim: map[types.UID][]string{}}
}

// Synced implements Allocated: the informer listed every claim (always
// true for a record fed by hand).
func (a *Allocations) Synced() bool { return a.synced == nil || a.synced() }

// Set records a claim as it is now.
func (a *Allocations) Set(obj any) {
	claim, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return
	}
	var devices []string
	if alloc := claim.Status.Allocation; alloc != nil {
		for _, r := range alloc.Devices.Results {
			if r.Driver == a.driver && r.Pool == a.pool && (r.AdminAccess == nil || !*r.AdminAccess) {
				devices = append(devices, r.Device)
			}
		}
	}
	a.update(claim.UID, devices)
}

// Delete forgets a claim.
func (a *Allocations) Delete(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if claim, ok := obj.(*resourceapi.ResourceClaim); ok {
		a.update(claim.UID, nil)
	}
}

func (a *Allocations) update(uid types.UID, devices []string) {
	a.mu.Lock()
	old, had := a.byClaim[uid]
	if len(devices) == 0 {
		delete(a.byClaim, uid)
	} else {
		a.byClaim[uid] = devices
	}
	a.mu.Unlock()
	if (had || len(devices) > 0) && !slices.Equal(old, devices) {
		a.signal()
	}
}

func (a *Allocations) signal() {
	select {
	case a.changed <- struct{}{}:
	default:
	}
}

// AllocatedDevices implements Allocated.
func (a *Allocations) AllocatedDevices() map[string]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]bool{}
	for _, devices := range a.byClaim {
		for _, d := range devices {
			out[d] = true
		}
	}
	return out
}

// AllocationsChanged implements Allocated.
func (a *Allocations) AllocationsChanged() <-chan struct{} { return a.changed }

// Claims returns how many claims hold devices of the pool.
func (a *Allocations) Claims() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.byClaim)
}

// stripClaim keeps what Set reads of a claim.
func stripClaim(obj any) (any, error) {
	claim, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return obj, nil
	}
	out := &resourceapi.ResourceClaim{}
	out.Name, out.Namespace, out.UID, out.ResourceVersion = claim.Name, claim.Namespace, claim.UID, claim.ResourceVersion
	out.Status.Allocation = claim.Status.Allocation
	return out, nil
}
