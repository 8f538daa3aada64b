package clusternodes

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/publisher"
	"github.com/gpu-dra/gpu-dra-driver/pkg/reserve"
)

// Resources turns the slices PrintSlices gives for one node back into what
// the plugin hands its publisher: the node's pool, its slices in order.
func Resources(slices []*resourceapi.ResourceSlice) (resourceslice.DriverResources, error) {
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{}}
	for _, s := range slices {
		if s.Spec.Pool.Name == "" {
			return res, fmt.Errorf("ResourceSlice %s: no spec.pool.name", s.GenerateName)
		}
		p := res.Pools[s.Spec.Pool.Name]
		p.Slices = append(p.Slices, resourceslice.Slice{Devices: s.Spec.Devices, SharedCounters: s.Spec.SharedCounters})
		res.Pools[s.Spec.Pool.Name] = p
	}
	return res, nil
}

// Followers publish the slices of nodes that have no kubelet the way their
// plugin would: each node runs the plugin's publication path
// (publisher.Run with withdrawal, through the slice controller of
// k8s.io/dynamic-resource-allocation as kubeletplugin.Helper does), and
// what it has prepared follows the claims allocated to it, as its kubelet
// and plugin would prepare them: a claim allocated devices of the node's
// pool is prepared there, and unprepared once it is deallocated or
// deleted. The pods themselves never run. With a reserve policy each node
// also runs it (pkg/reserve) as the plugin does when its device policy
// enables it; what the node has prepared is what is allocated on it, so
// the tracker follows the prepares alone.
type Followers struct {
	driver string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	held  map[types.UID]map[string][]string // claim -> pool -> devices
	nodes map[string]*followed

	publications atomic.Int64
}

// followed is one node: its publisher's Prepared, Target and Stored.
type followed struct {
	f          *Followers
	node       string
	slices     int // the slice count of its pool
	changed    chan struct{}
	stored     publisher.Stored
	controller *resourceslice.Controller
}

// Follow starts publishing resources (node name -> the node's resources,
// one pool named after the node, the full model) for nodes that exist,
// with driver's devices withdrawn as the claims allocated on them are
// prepared, and what policy does not publish hidden when it is enabled.
// Stop ends it; the slices stay.
func Follow(ctx context.Context, client kubernetes.Interface, driver string, resources map[string]resourceslice.DriverResources, policy devicemodel.ReservePolicy) (*Followers, error) {
	ctx, cancel := context.WithCancel(ctx)
	f := &Followers{driver: driver, cancel: cancel, held: map[types.UID]map[string][]string{}, nodes: map[string]*followed{}}
	for node, res := range resources {
		pool, ok := res.Pools[node]
		if !ok || len(res.Pools) != 1 {
			cancel()
			return nil, fmt.Errorf("resources of node %s: want one pool named after the node, have %d pools", node, len(res.Pools))
		}
		f.nodes[node] = &followed{f: f, node: node, slices: len(pool.Slices), changed: make(chan struct{}, 1),
			stored: publisher.WatchSlices(ctx, client, driver, node)}
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	claims := factory.Resource().V1().ResourceClaims().Informer()
	if _, err := claims.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { f.claimChanged(obj, false) },
		UpdateFunc: func(_, obj any) { f.claimChanged(obj, false) },
		DeleteFunc: func(obj any) { f.claimChanged(obj, true) },
	}); err != nil {
		cancel()
		return nil, fmt.Errorf("watch ResourceClaims: %w", err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), claims.HasSynced) {
		cancel()
		return nil, fmt.Errorf("ResourceClaims not listed: %w", context.Cause(ctx))
	}
	for node, res := range resources {
		n := f.nodes[node]
		var hide publisher.Reserve
		if policy.Enabled() {
			tracker, err := reserve.New(ctx, reserve.Options{Policy: policy})
			if err != nil {
				cancel()
				f.wg.Wait()
				return nil, fmt.Errorf("reserve policy of node %s: %w", node, err)
			}
			hide = tracker
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			publisher.Run(ctx, publisher.Options{
				Target: &sliceTarget{ctx: ctx, client: client, n: n}, Health: healthy{}, Resources: res,
				Pool: node, Prepared: n, Stored: n.stored, Reserve: hide,
				Devices: func() []health.Device { return nil }, Policy: health.DefaultTaintPolicy(driver),
			})
			if n.controller != nil {
				n.controller.Stop()
			}
		}()
	}
	return f, nil
}

// Stop stops every node's publisher and waits for them.
func (f *Followers) Stop() {
	f.cancel()
	f.wg.Wait()
}

// Publications counts the slice publications after each node's first:
// each changes one slice (pkg/publisher).
func (f *Followers) Publications() int64 { return f.publications.Load() }

// Published says whether every node's slices are all stored.
func (f *Followers) Published() bool {
	for _, n := range f.nodes {
		if len(n.stored.Slices(n.node)) != n.slices {
			return false
		}
	}
	return true
}

// Stored counts the devices stored in the nodes' slices now, and the
// nodes by how many devices the claims allocated on them hold.
func (f *Followers) Stored() (devices int, nodesByHeld map[int]int) {
	nodesByHeld = map[int]int{}
	for _, n := range f.nodes {
		for _, s := range n.stored.Slices(n.node) {
			devices += len(s.Spec.Devices)
		}
		nodesByHeld[len(n.PreparedDevices())]++
	}
	return devices, nodesByHeld
}

// claimChanged records what a claim holds on which node (nothing once it
// is deleted or being deleted: its pod is gone, so the kubelet unprepares
// it) and signals the nodes whose prepared devices changed.
func (f *Followers) claimChanged(obj any, deleted bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	claim, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return
	}
	now := map[string][]string{}
	if !deleted && claim.DeletionTimestamp == nil && claim.Status.Allocation != nil {
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver == f.driver {
				now[r.Pool] = append(now[r.Pool], r.Device)
			}
		}
	}
	f.mu.Lock()
	before := f.held[claim.UID]
	if len(now) == 0 {
		delete(f.held, claim.UID)
	} else {
		f.held[claim.UID] = now
	}
	var signal []*followed
	for pool := range merged(before, now) {
		if n, ok := f.nodes[pool]; ok && !slices.Equal(before[pool], now[pool]) {
			signal = append(signal, n)
		}
	}
	f.mu.Unlock()
	for _, n := range signal {
		select {
		case n.changed <- struct{}{}:
		default: // one pending signal stands for any number
		}
	}
}

func merged(a, b map[string][]string) map[string][]string {
	out := maps.Clone(a)
	if out == nil {
		out = map[string][]string{}
	}
	maps.Copy(out, b)
	return out
}

// PreparedDevices implements publisher.Prepared.
func (n *followed) PreparedDevices() map[string]bool {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	out := map[string]bool{}
	for _, pools := range n.f.held {
		for _, d := range pools[n.node] {
			out[d] = true
		}
	}
	return out
}

// PreparedChanged implements publisher.Prepared.
func (n *followed) PreparedChanged() <-chan struct{} { return n.changed }

// sliceTarget publishes through the slice controller as
// kubeletplugin.Helper.PublishResources does: started on the first
// publication with the Node as owner, updated after.
type sliceTarget struct {
	ctx    context.Context
	client kubernetes.Interface
	n      *followed
}

func (t *sliceTarget) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	if t.n.controller != nil {
		t.n.f.publications.Add(1)
		t.n.controller.Update(&res)
		return nil
	}
	c, err := resourceslice.StartController(t.ctx, resourceslice.Options{
		DriverName: t.n.f.driver, KubeClient: t.client, Resources: &res,
		Owner: &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: t.n.node},
	})
	if err != nil {
		return fmt.Errorf("start the ResourceSlice controller of node %s: %w", t.n.node, err)
	}
	t.n.controller = c
	return nil
}

// healthy is a health source whose GPUs stay healthy.
type healthy struct{}

func (healthy) Subscribe(context.Context) <-chan health.Snapshot {
	ch := make(chan health.Snapshot, 1)
	ch <- health.Snapshot{}
	return ch
}
