// Package staleclaims releases claims the kubelet will never unprepare.
//
// The kubelet unprepares a claim when its last pod on the node is gone,
// also after a restart, from its own record (the dra_manager_state
// checkpoint). When that record is lost (removed in a node repair, or an
// unprepare that never comes), the plugin keeps the claim prepared for
// ever: its devices stay reserved in the prepare engine, and the next claim
// the scheduler gives them to fails to prepare. A Releaser walks the
// engine's prepared claims, asks the API server about each, and releases a
// claim that stayed stale for a grace period: its ResourceClaim is gone,
// has another UID, or is no longer allocated to this node's pool. A claim
// that exists allocated here is never released, and neither is one the API
// server could not be asked about.
package staleclaims

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// Engine is what a Releaser needs of the prepare engine (*prepare.Engine).
type Engine interface {
	// PreparedClaims returns the claims the engine holds.
	PreparedClaims() []checkpoint.PreparedClaim
	// ReleaseClaim unprepares the claim if stillStale, called under the
	// lock every prepare and unprepare of the claim takes, returns nil.
	ReleaseClaim(ctx context.Context, claim kubeletplugin.NamespacedObject, stillStale func(context.Context) error) error
}

// Why a claim is stale: the reason label of the metric and the event.
const (
	ReasonDeleted      = "deleted"       // the ResourceClaim is gone
	ReasonReplaced     = "replaced"      // a ResourceClaim of that name has another UID
	ReasonNotAllocated = "not_allocated" // it is no longer allocated to this node's pool
)

// Options configure a Releaser.
type Options struct {
	// Client gets ResourceClaims and creates the Node's events.
	Client kubernetes.Interface
	Engine Engine
	// DriverName and PoolName pick the claim's allocation results that
	// this node serves; NodeName gets the events.
	DriverName, PoolName, NodeName string
	// GracePeriod is how long a claim must stay stale before it is
	// released; it gives the kubelet time for its own cleanup. Positive.
	GracePeriod time.Duration
	// Period is how often the claims are checked; zero: GracePeriod/4,
	// between 1s and 1m.
	Period time.Duration
	// Clock tells the time (tests step a fake one); nil: the real clock.
	Clock clock.PassiveClock
}

// Releaser releases stale claims; see the package comment.
type Releaser struct {
	opts    Options
	metrics *Metrics
	// firstStale is when each claim was first found stale, by UID; only
	// Check touches it.
	firstStale map[types.UID]time.Time
}

// New returns a Releaser.
func New(opts Options) (*Releaser, error) {
	switch {
	case opts.Client == nil:
		return nil, errors.New("stale claims: no API client")
	case opts.Engine == nil:
		return nil, errors.New("stale claims: no prepare engine")
	case opts.DriverName == "" || opts.PoolName == "" || opts.NodeName == "":
		return nil, fmt.Errorf("stale claims: driver %q, pool %q and node %q must all be set", opts.DriverName, opts.PoolName, opts.NodeName)
	case opts.GracePeriod <= 0:
		return nil, fmt.Errorf("stale claims: grace period %s must be positive", opts.GracePeriod)
	case opts.Period < 0:
		return nil, fmt.Errorf("stale claims: period %s must not be negative", opts.Period)
	}
	if opts.Period == 0 {
		opts.Period = min(max(opts.GracePeriod/4, time.Second), time.Minute)
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Releaser{opts: opts, metrics: newMetrics(opts.NodeName), firstStale: map[types.UID]time.Time{}}, nil
}

// Metrics returns the Releaser's metrics, for the plugin's registry.
func (r *Releaser) Metrics() *Metrics { return r.metrics }

// Run checks the claims at once and then every Period until ctx ends.
func (r *Releaser) Run(ctx context.Context) {
	klog.FromContext(ctx).Info("Releasing stale claims", "gracePeriod", r.opts.GracePeriod, "period", r.opts.Period)
	ticker := time.NewTicker(r.opts.Period)
	defer ticker.Stop()
	for {
		r.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// errInUse stops a release: the claim is allocated to this node again.
var errInUse = errors.New("the claim is allocated to this node")

// Check looks at every prepared claim once and releases those stale for
// the grace period; it returns how many it released.
func (r *Releaser) Check(ctx context.Context) int {
	logger := klog.FromContext(ctx)
	now := r.opts.Clock.Now()
	released := 0
	seen := map[types.UID]bool{}
	for _, c := range r.opts.Engine.PreparedClaims() {
		if !c.State.Known() {
			continue // a newer release's entry: left alone, as the engine does
		}
		seen[c.UID] = true
		log := logger.WithValues("claim", klog.KRef(c.Namespace, c.Name), "claimUID", c.UID)
		reason, err := r.staleness(ctx, &c)
		switch {
		case err != nil:
			log.Error(err, "Cannot tell whether a prepared claim is stale; keeping it")
			continue
		case reason == "":
			delete(r.firstStale, c.UID)
			continue
		}
		first, ok := r.firstStale[c.UID]
		if !ok {
			r.firstStale[c.UID] = now
			log.Info("Prepared claim is stale; releasing it after the grace period unless the kubelet unprepares it", "reason", reason, "gracePeriod", r.opts.GracePeriod)
			continue
		}
		if now.Sub(first) < r.opts.GracePeriod {
			continue
		}
		if r.release(klog.NewContext(ctx, log), &c) {
			released++
		}
	}
	for uid := range r.firstStale {
		if !seen[uid] {
			delete(r.firstStale, uid) // unprepared meanwhile
		}
	}
	return released
}

// release releases c if it is still stale when the engine holds its lock.
func (r *Releaser) release(ctx context.Context, c *checkpoint.PreparedClaim) bool {
	logger := klog.FromContext(ctx)
	var reason string
	obj := kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}
	err := r.opts.Engine.ReleaseClaim(ctx, obj, func(ctx context.Context) error {
		var err error
		if reason, err = r.staleness(ctx, c); err == nil && reason == "" {
			err = errInUse
		}
		return err
	})
	switch {
	case errors.Is(err, errInUse):
		logger.Info("Stale claim is allocated to this node again; keeping it")
		delete(r.firstStale, c.UID)
		return false
	case err != nil:
		logger.Error(err, "Release stale claim")
		return false
	}
	delete(r.firstStale, c.UID)
	devices := deviceNames(c)
	logger.Info("Released stale claim", "reason", reason, "devices", devices)
	r.metrics.released.WithLabelValues(reason).Inc()
	r.event(ctx, c, reason, devices)
	return true
}

// staleness says why c is stale, "" if its ResourceClaim exists allocated
// to this node's pool. An error means the API server could not tell.
func (r *Releaser) staleness(ctx context.Context, c *checkpoint.PreparedClaim) (string, error) {
	claim, err := r.opts.Client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return ReasonDeleted, nil
	case err != nil:
		return "", fmt.Errorf("get ResourceClaim %s/%s: %w", c.Namespace, c.Name, err)
	case claim.UID != c.UID:
		return ReasonReplaced, nil
	case !r.allocatedHere(claim):
		return ReasonNotAllocated, nil
	}
	return "", nil
}

func (r *Releaser) allocatedHere(claim *resourceapi.ResourceClaim) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	return slices.ContainsFunc(claim.Status.Allocation.Devices.Results, func(res resourceapi.DeviceRequestAllocationResult) bool {
		return res.Driver == r.opts.DriverName && res.Pool == r.opts.PoolName
	})
}

func deviceNames(c *checkpoint.PreparedClaim) []string {
	names := make([]string, 0, len(c.Devices))
	for _, d := range c.Devices {
		name := d.Device
		if d.ShareID != "" {
			name += "#" + d.ShareID
		}
		names = append(names, name)
	}
	return names
}
