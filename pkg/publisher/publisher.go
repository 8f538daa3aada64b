// Package publisher keeps the node's ResourceSlices published: the device
// model's resources without the devices that what is prepared on the node
// makes impossible to allocate, with the devices of unhealthy GPUs tainted,
// at start and again on every prepare, unprepare and health change. It
// changes one slice per publication, so the slice controller never has to
// bump the pool's generation and the scheduler never sees the pool
// incomplete (docs/device-model.md, "What is published when").
package publisher

import (
	"context"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
)

// Target publishes ResourceSlices; *kubeletplugin.Helper implements it.
type Target interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// HealthSource sends the GPUs' health at once and on every change;
// *health.Monitor implements it.
type HealthSource interface {
	Subscribe(ctx context.Context) <-chan health.Snapshot
}

// Prepared says which devices the node has prepared; *prepare.Engine
// implements it.
type Prepared interface {
	// PreparedDevices names the devices of the node's pool that claims
	// hold on the node.
	PreparedDevices() map[string]bool
	// PreparedChanged is signaled after every prepare and unprepare.
	PreparedChanged() <-chan struct{}
}

// Reserve hides what the reserve policy does not publish;
// *reserve.Tracker implements it.
type Reserve interface {
	// Hide returns res (the full model) without the MIG placements and
	// shares of the GPUs that do not publish them, given the devices
	// prepared on the node;
	// after > 0 asks for another call that much later (a hold ends).
	Hide(ctx context.Context, res resourceslice.DriverResources, pool string, prepared map[string]bool) (out resourceslice.DriverResources, after time.Duration)
	// Changed is signaled when what Hide returns may have changed (the
	// pool's allocations changed).
	Changed() <-chan struct{}
}

// DefaultCoalesce is how long the publisher waits after a prepare or
// unprepare for the rest of a burst before it publishes: a pod's claims,
// or several pods started together, then cost one write per GPU slice.
const DefaultCoalesce = 100 * time.Millisecond

// DefaultConfirmTimeout bounds the wait for one slice update to be stored
// before the next: past it the publisher goes on (the next update may then
// make the slice controller bump the pool's generation).
const DefaultConfirmTimeout = 10 * time.Second

// Options configure Run.
type Options struct {
	Target Target
	Health HealthSource
	// Resources are what the node publishes while nothing is prepared and
	// every GPU is healthy: the full model (devicemodel.Resources).
	Resources resourceslice.DriverResources
	// Pool is the node's pool, whose devices Prepared names.
	Pool string
	// Prepared, when set, has the devices that prepared claims make
	// impossible to allocate withdrawn (devicemodel.Withdraw).
	Prepared Prepared
	// Reserve, when set, hides what the reserve policy does not publish
	// (before withdrawal).
	Reserve Reserve
	// Stored, when set, confirms each slice update before the next one
	// is published (WatchSlices).
	Stored Stored
	// Devices lists the published devices with the GPU (and MIG instance)
	// each follows; it is called for every publication, so MIG instances
	// prepared since are reflected.
	Devices func() []health.Device
	// Policy says which taint each condition gets.
	Policy health.TaintPolicy
	// Coalesce and ConfirmTimeout default to DefaultCoalesce and
	// DefaultConfirmTimeout.
	Coalesce, ConfirmTimeout time.Duration
}

// Run publishes until ctx is canceled or the health source stops. The
// first publication waits for the first health snapshot (the monitor sends
// one at once). A failed publication is logged; the next change publishes
// again.
func Run(ctx context.Context, opts Options) {
	if opts.Coalesce == 0 {
		opts.Coalesce = DefaultCoalesce
	}
	if opts.ConfirmTimeout == 0 {
		opts.ConfirmTimeout = DefaultConfirmTimeout
	}
	r := &run{opts: opts, snaps: opts.Health.Subscribe(ctx)}
	var changed, reserveChanged <-chan struct{}
	if opts.Prepared != nil {
		changed = opts.Prepared.PreparedChanged()
	}
	if opts.Reserve != nil {
		reserveChanged = opts.Reserve.Changed()
	}
	var wake <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case snap, ok := <-r.snaps:
			if !ok {
				return
			}
			r.snap, r.started = snap, true
		case <-wake:
		case <-changed:
			if !coalesce(ctx, opts.Coalesce) {
				return
			}
		case <-reserveChanged:
			if !coalesce(ctx, opts.Coalesce) {
				return
			}
		}
		if r.started && !r.converge(ctx) {
			return
		}
		wake = nil
		if r.after > 0 {
			wake = time.After(r.after)
		}
	}
}

// coalesce waits d for the rest of a burst; false when ctx ended.
func coalesce(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// run is the state of one Run.
type run struct {
	opts    Options
	snaps   <-chan health.Snapshot
	snap    health.Snapshot
	started bool
	// published is what the target was last given, nil before that.
	published *resourceslice.DriverResources
	// after is when the reserve policy asked to be asked again.
	after time.Duration
}

// converge publishes, one slice at a time, until the published resources
// are the desired ones, taking health changes that arrive meanwhile. It
// returns false when the health source stopped.
func (r *run) converge(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	for ctx.Err() == nil {
		desired := r.desired(ctx)
		next, index := step(r.published, desired)
		if next == nil {
			return true
		}
		if err := r.opts.Target.PublishResources(ctx, *next); err != nil {
			if ctx.Err() == nil {
				logger.Error(err, "Publish ResourceSlices")
			}
			return true
		}
		r.published = next
		if index.slice >= 0 && r.opts.Stored != nil {
			start := time.Now()
			if err := confirm(ctx, r.opts.Stored, index, next, r.opts.ConfirmTimeout); err != nil {
				logger.V(2).Info("Slice update not seen stored, publishing the next one anyway", "pool", index.pool, "slice", index.slice, "err", err)
			} else {
				logger.V(5).Info("Slice update stored", "pool", index.pool, "slice", index.slice, "after", time.Since(start))
			}
		}
		select {
		case snap, ok := <-r.snaps:
			if !ok {
				return false
			}
			r.snap = snap
		default:
		}
	}
	return true
}

// desired is what the node should publish now.
func (r *run) desired(ctx context.Context) resourceslice.DriverResources {
	res := r.opts.Resources
	var prepared map[string]bool
	if r.opts.Prepared != nil {
		prepared = r.opts.Prepared.PreparedDevices()
	}
	// The reserve policy reads what is held off the full model; it never
	// hides a prepared device, so withdrawing after it withdraws the same.
	r.after = 0
	if r.opts.Reserve != nil {
		res, r.after = r.opts.Reserve.Hide(ctx, res, r.opts.Pool, prepared)
	}
	if prepared != nil {
		res = devicemodel.Withdraw(res, r.opts.Pool, prepared)
	}
	return health.TaintResources(res, r.snap, r.opts.Devices(), r.opts.Policy)
}

// sliceIndex names one slice of a pool; slice -1 stands for all of them.
type sliceIndex struct {
	pool  string
	slice int
}

// step returns what to publish next on the way from published to desired:
// desired itself when nothing was published yet or the pools or slice
// counts differ, otherwise published with its first slice that differs
// from desired replaced, and which slice that is. It returns nil when
// published is desired.
func step(published *resourceslice.DriverResources, desired resourceslice.DriverResources) (*resourceslice.DriverResources, sliceIndex) {
	all := sliceIndex{slice: -1}
	if published == nil || len(published.Pools) != len(desired.Pools) {
		return &desired, all
	}
	for _, name := range sortedPools(desired) {
		want := desired.Pools[name]
		have, ok := published.Pools[name]
		if !ok || len(have.Slices) != len(want.Slices) || have.Generation != want.Generation ||
			!apiequality.Semantic.DeepEqual(have.NodeSelector, want.NodeSelector) {
			return &desired, all
		}
		for i := range want.Slices {
			if sameSlice(have.Slices[i], want.Slices[i]) {
				continue
			}
			next := resourceslice.DriverResources{Pools: make(map[string]resourceslice.Pool, len(published.Pools))}
			for n, p := range published.Pools {
				next.Pools[n] = p
			}
			slices := append([]resourceslice.Slice(nil), have.Slices...)
			slices[i] = want.Slices[i]
			have.Slices = slices
			next.Pools[name] = have
			return &next, sliceIndex{pool: name, slice: i}
		}
	}
	return nil, all
}

func sameSlice(a, b resourceslice.Slice) bool {
	return resourceslice.DevicesDeepEqual(a.Devices, b.Devices) &&
		apiequality.Semantic.DeepEqual(a.SharedCounters, b.SharedCounters)
}
