package podattribution

import (
	"context"
	"fmt"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

const (
	// lookupTimeout bounds one GET of a pod.
	lookupTimeout = 10 * time.Second
	// retryBase and retryMax bound the per-pod backoff after failed lookups.
	retryBase = time.Second
	retryMax  = 5 * time.Minute
)

// Attribution remembers who uses each prepared claim, for the holder labels
// of device metrics: the pods of the claim's status.reservedFor, recorded at
// prepare, and the containers of those pods that use the claim, looked up
// in the background with one GET per pod. The pod fields that say which
// container uses which claim are immutable, so a successful lookup is
// repeated only to learn container IDs (which the pod's status gets once its
// containers start, after prepare): when a process on a GPU runs in a
// container the last lookup did not list (Processes), at most every
// refreshInterval. Failed ones are retried with a per-pod exponential backoff. One
// lookup runs at a time, so prepares never wait for the API server.
//
// Nothing is persisted: after a restart the prepare engine records again
// the claims its checkpoint holds as prepared (prepare.Options.Claims).
type Attribution struct {
	pods  corev1client.PodsGetter
	queue workqueue.TypedRateLimitingInterface[podRef]

	mu     sync.Mutex
	claims map[types.UID]claimPods
	// known maps looked-up pods to the containers using each of their
	// claims (by claim name); a pod found gone has an empty map.
	known map[types.UID]map[string][]ContainerUse
	// lookedUp is when each known pod was last read; stale marks a known
	// pod to read again (learnContainer).
	lookedUp map[types.UID]time.Time
	stale    map[types.UID]bool
}

// podRef is a pod a claim is reserved for.
type podRef struct {
	Namespace, Name string
	UID             types.UID
}

type claimPods struct {
	name string
	pods []podRef
}

// New returns an Attribution that looks up containers through pods (a
// clientset's CoreV1()). With nil pods it records only the pods and leaves
// the container label empty.
func New(pods corev1client.PodsGetter) *Attribution {
	return newAttribution(pods, workqueue.NewTypedItemExponentialFailureRateLimiter[podRef](retryBase, retryMax))
}

func newAttribution(pods corev1client.PodsGetter, limiter workqueue.TypedRateLimiter[podRef]) *Attribution {
	return &Attribution{
		pods:     pods,
		queue:    workqueue.NewTypedRateLimitingQueue(limiter),
		claims:   map[types.UID]claimPods{},
		known:    map[types.UID]map[string][]ContainerUse{},
		lookedUp: map[types.UID]time.Time{},
		stale:    map[types.UID]bool{},
	}
}

// Record remembers the pods a prepared claim is reserved for and queues a
// lookup of those whose containers are not known yet. It does not block.
func (a *Attribution) Record(ctx context.Context, claim *resourceapi.ResourceClaim) {
	rec := claimPods{name: claim.Name}
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			rec.pods = append(rec.pods, podRef{Namespace: claim.Namespace, Name: r.Name, UID: r.UID})
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.claims[claim.UID] = rec
	a.pruneLocked()
	if a.pods == nil {
		return
	}
	for _, p := range rec.pods {
		if _, ok := a.known[p.UID]; !ok {
			klog.FromContext(ctx).V(5).Info("Queueing container lookup", "pod", klog.KRef(p.Namespace, p.Name), "podUID", p.UID)
			a.queue.Add(p)
		}
	}
}

// Forget drops an unprepared claim, and what is known of pods no other
// claim is reserved for.
func (a *Attribution) Forget(claimUID types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.claims, claimUID)
	a.pruneLocked()
}

// Consumers returns the pods using a claim: one entry per container known
// to use it, or one without a container while the pod's containers are not
// known (or none of them uses the claim).
func (a *Attribution) Consumers(claimUID types.UID) []Consumer {
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := a.claims[claimUID]
	var out []Consumer
	for _, p := range rec.pods {
		uses := a.known[p.UID][rec.name]
		if len(uses) == 0 {
			out = append(out, Consumer{Pod: p.Name, PodUID: p.UID})
		}
		for _, u := range uses {
			out = append(out, Consumer{Pod: p.Name, PodUID: p.UID, Container: u.Container, ContainerIDs: u.ContainerIDs, Requests: u.Requests})
		}
	}
	return out
}

// Run looks up queued pods until ctx is canceled.
func (a *Attribution) Run(ctx context.Context) {
	if a.pods == nil {
		return
	}
	go func() {
		<-ctx.Done()
		a.queue.ShutDown()
	}()
	for a.processNext(ctx) {
	}
}

func (a *Attribution) processNext(ctx context.Context) bool {
	ref, quit := a.queue.Get()
	if quit {
		return false
	}
	defer a.queue.Done(ref)
	if !a.needsLookup(ref.UID) {
		a.queue.Forget(ref)
		return true
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(ref.Namespace, ref.Name), "podUID", ref.UID)
	uses, err := a.lookup(ctx, ref)
	if err != nil {
		logger.V(2).Info("Cannot look up the containers using the pod's claims; will retry", "err", err, "attempts", a.queue.NumRequeues(ref)+1)
		a.queue.AddRateLimited(ref)
		return true
	}
	a.queue.Forget(ref)
	logger.V(4).Info("Looked up the containers using the pod's claims", "claims", uses)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.wantedLocked(ref.UID) { // not unprepared meanwhile
		a.known[ref.UID] = uses
		a.lookedUp[ref.UID] = time.Now()
		delete(a.stale, ref.UID)
	}
	return true
}

// lookup GETs the pod. A pod that is gone, or was replaced by one of the
// same name, yields an empty map: its containers cannot be known.
func (a *Attribution) lookup(ctx context.Context, ref podRef) (map[string][]ContainerUse, error) {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	pod, err := a.pods.Pods(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		klog.FromContext(ctx).V(4).Info("Pod is gone; its containers stay unknown", "pod", klog.KRef(ref.Namespace, ref.Name))
		return map[string][]ContainerUse{}, nil
	case err != nil:
		return nil, fmt.Errorf("get pod %s/%s: %w", ref.Namespace, ref.Name, err)
	case pod.UID != ref.UID:
		klog.FromContext(ctx).V(4).Info("Pod was recreated; the claim's pod is gone", "pod", klog.KObj(pod), "podUID", ref.UID, "newUID", pod.UID)
		return map[string][]ContainerUse{}, nil
	}
	return ClaimContainers(pod), nil
}

// needsLookup reports whether the pod is still wanted and not known: it
// may have been queued again while it was being looked up.
func (a *Attribution) needsLookup(uid types.UID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, known := a.known[uid]
	return (!known || a.stale[uid]) && a.wantedLocked(uid)
}

// wantedLocked reports whether a recorded claim is reserved for the pod.
func (a *Attribution) wantedLocked(uid types.UID) bool {
	for _, c := range a.claims {
		for _, p := range c.pods {
			if p.UID == uid {
				return true
			}
		}
	}
	return false
}

// pruneLocked forgets pods no recorded claim is reserved for.
func (a *Attribution) pruneLocked() {
	for uid := range a.known {
		if !a.wantedLocked(uid) {
			delete(a.known, uid)
			delete(a.lookedUp, uid)
			delete(a.stale, uid)
		}
	}
}
