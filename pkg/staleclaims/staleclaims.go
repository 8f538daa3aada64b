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
// has another UID, is no longer allocated to this node's pool (or, for a
// compute domain's channel, to the clique's channel pool), or is
// allocated here to other devices (reallocated under the same UID: its
// prepare waits for this release). A claim that exists allocated here to
// its prepared devices is never released, and neither is one the API
// server could not be asked about, nor one a container may still use
// (guards.go): a stale claim is held back while the kubelet lists a
// container with it, a pod it was reserved for still runs here, or NVML
// lists a process on its devices, and when that cannot be told.
package staleclaims

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
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
	ReasonNotAllocated = "not_allocated" // it is no longer allocated to this node's pool, nor a channel to its clique's
	ReasonReallocated  = "reallocated"   // it is allocated here to other devices
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

	// The evidence that a container may still use a stale claim (see
	// guards.go). Client's pods are always asked.
	//
	// PodResourcesSocket is the kubelet's pod-resources socket; empty:
	// the kubelet is not asked.
	PodResourcesSocket string
	// NVML lists the processes on the claim's devices; nil: not asked.
	NVML nvml.Interface
	// ProcRoot is the host's /proc, for the pod of a process on a device
	// the claim shares; empty: /proc.
	ProcRoot string
	// EvidenceTimeout bounds a PodResources call; zero: 10s.
	EvidenceTimeout time.Duration
}

// Releaser releases stale claims; see the package comment.
type Releaser struct {
	opts    Options
	metrics *Metrics
	// firstStale is when each claim was first found stale, by UID; only
	// Check touches it.
	firstStale map[types.UID]time.Time
	// heldFor is why each claim stale for the grace period is held back,
	// by UID: a new reason records a new event. Only Check touches it.
	heldFor map[types.UID]string
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
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if opts.EvidenceTimeout == 0 {
		opts.EvidenceTimeout = 10 * time.Second
	}
	return &Releaser{opts: opts, metrics: newMetrics(opts.NodeName), firstStale: map[types.UID]time.Time{}, heldFor: map[types.UID]string{}}, nil
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
	prepared := r.opts.Engine.PreparedClaims()
	defer r.countHeld()
	for _, c := range prepared {
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
			delete(r.heldFor, c.UID)
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
		if r.release(klog.NewContext(ctx, log), &c, prepared) {
			released++
		}
	}
	for uid := range r.firstStale {
		if !seen[uid] {
			delete(r.firstStale, uid) // unprepared meanwhile
			delete(r.heldFor, uid)
		}
	}
	return released
}

// release releases c if it is still stale when the engine holds its lock.
// Under that lock no prepare or unprepare of the claim runs, so what the
// guards see stays true until the release is done.
func (r *Releaser) release(ctx context.Context, c *checkpoint.PreparedClaim, prepared []checkpoint.PreparedClaim) bool {
	logger := klog.FromContext(ctx)
	var reason string
	obj := kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}
	err := r.opts.Engine.ReleaseClaim(ctx, obj, func(ctx context.Context) error {
		var err error
		if reason, err = r.staleness(ctx, c); err == nil && reason == "" {
			err = errInUse
		}
		if err != nil {
			return err
		}
		return r.inUse(ctx, c, prepared)
	})
	if h, ok := isHeld(err); ok {
		r.hold(ctx, c, reason, h)
		return false
	}
	switch {
	case errors.Is(err, errInUse):
		logger.Info("Stale claim is allocated to this node again; keeping it")
		delete(r.firstStale, c.UID)
		delete(r.heldFor, c.UID)
		return false
	case err != nil:
		logger.Error(err, "Release stale claim")
		return false
	}
	delete(r.firstStale, c.UID)
	delete(r.heldFor, c.UID)
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
	case !r.allocatedHere(claim, c):
		return ReasonNotAllocated, nil
	case !r.allocatedTo(claim, c):
		return ReasonReallocated, nil
	}
	return "", nil
}

// allocatedTo reports whether the claim's results for this driver and
// the pools c is served from are the devices c was prepared with.
func (r *Releaser) allocatedTo(claim *resourceapi.ResourceClaim, c *checkpoint.PreparedClaim) bool {
	want := map[string]int{}
	for _, d := range c.Devices {
		want[d.Request+"/"+d.Pool+"/"+d.Device+"#"+d.ShareID]++
	}
	for _, res := range claim.Status.Allocation.Devices.Results {
		if !r.servedHere(res, c) {
			continue
		}
		key := res.Request + "/" + res.Pool + "/" + res.Device + "#"
		if res.ShareID != nil {
			key += string(*res.ShareID)
		}
		if want[key] == 0 {
			return false
		}
		want[key]--
	}
	for _, n := range want {
		if n != 0 {
			return false
		}
	}
	return true
}

func (r *Releaser) allocatedHere(claim *resourceapi.ResourceClaim, c *checkpoint.PreparedClaim) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	return slices.ContainsFunc(claim.Status.Allocation.Devices.Results, func(res resourceapi.DeviceRequestAllocationResult) bool {
		return r.servedHere(res, c)
	})
}

// servedHere reports whether this node serves the result for c: one of
// this driver from the node's pool, or from the clique's channel pool a
// channel of c was prepared from (a compute domain's channel comes from
// dra-controller's pool, which every node of the clique serves).
func (r *Releaser) servedHere(res resourceapi.DeviceRequestAllocationResult, c *checkpoint.PreparedClaim) bool {
	if res.Driver != r.opts.DriverName {
		return false
	}
	if res.Pool == r.opts.PoolName {
		return true
	}
	if _, ok := vocabulary.ChannelPoolClique(res.Pool); !ok {
		return false
	}
	return slices.ContainsFunc(c.Devices, func(d checkpoint.PreparedDevice) bool {
		return d.Kind == vocabulary.KindIMEXChannel && d.Pool == res.Pool
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
