package computedomain

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// liveRecheck is when to look again after the API server contradicted the
// caches (a claim in use, another claim, a domain that changed): the
// caches' events normally come sooner.
const liveRecheck = 10 * time.Second

// sighting is when this controller instance first saw a domain (its UID)
// without pods.
type sighting struct {
	uid types.UID
	at  time.Time
}

// afterLastPod deletes the AfterLastPod domain cd, whose cached claims have
// no pods, once its grace period is over, and returns when to look again.
//
// The grace period starts at the later of:
//
//   - the PodsScheduled condition's lastTransitionTime (False, NoPods),
//     which the controller writes when it sees the last pod go and which
//     survives a controller restart, and
//   - when this controller instance first saw the domain without pods.
//
// The condition alone cannot be trusted: whoever may patch
// computedomains/status (a tenant an administrator granted it) can write
// it with any time, also under the controller's field manager, which is
// only a name the writer chooses. The second bound is in memory, which no
// one else writes. So a forged or stale time never shortens the grace
// period. A restart starts it again at the restart, which delays the
// deletion by at most one grace period, and the NoPods reason the
// condition keeps still tells a domain whose pods went from one that never
// had any. A later time in the condition only delays the deletion.
func (c *Controller) afterLastPod(ctx context.Context, key string, cd *gpuv1beta1.ComputeDomain, claims domainClaims) (time.Duration, error) {
	now := c.opts.Now()
	since := c.sawLastPodGone(key, cd.UID, now)
	if cond := meta.FindStatusCondition(cd.Status.Conditions, ConditionPodsScheduled); cond != nil && cond.LastTransitionTime.After(since) {
		since = cond.LastTransitionTime.Time
	}
	grace := time.Duration(ptr.Deref(cd.Spec.Lifetime.GracePeriodSeconds, gpuv1beta1.DefaultGracePeriodSeconds)) * time.Second
	if wait := since.Add(grace).Sub(now); wait > 0 {
		return wait, nil
	}
	return c.deleteUnused(ctx, key, cd, claims, since)
}

// deleteUnused deletes the domain after checking with the API server, not
// the caches, that the domain is the one decided on and that its claims
// (the shared one: the cached one) are reserved for nothing. The delete's preconditions are
// the UID and the resource version checked, so a change to the domain in
// between (a node writing its entry) fails it, and the controller looks
// again.
func (c *Controller) deleteUnused(ctx context.Context, key string, cd *gpuv1beta1.ComputeDomain, claims domainClaims, since time.Time) (time.Duration, error) {
	logger := klog.FromContext(ctx)
	domains := c.domains.Namespace(cd.Namespace)
	live, err := domains.Get(ctx, cd.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c.forget(key, nil)
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read ComputeDomain %s before deleting it: %w", key, err)
	}
	if live.GetUID() != cd.UID || live.GetDeletionTimestamp() != nil {
		return 0, nil // replaced or going: its own events follow
	}
	liveClaims, ok, err := claims.live(ctx)
	if err != nil {
		return 0, err
	}
	if !ok {
		return liveRecheck, nil
	}
	for _, claim := range liveClaims {
		if n := len(claim.Status.ReservedFor); n > 0 {
			logger.V(2).Info("Not deleting ComputeDomain: the API server's claim is in use, the cache lags",
				"domain", klog.KObj(cd), "claim", klog.KObj(claim), "reservedFor", n)
			c.clearLastPodGone(key) // the grace period starts again when it is seen unused
			return liveRecheck, nil
		}
	}
	rv := live.GetResourceVersion()
	logger.Info("Deleting ComputeDomain after its last pod", "domain", klog.KObj(cd), "lastPodGone", since)
	err = domains.Delete(ctx, cd.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cd.UID, ResourceVersion: &rv}})
	switch {
	case apierrors.IsConflict(err):
		logger.V(2).Info("ComputeDomain changed since it was checked; not deleted", "domain", klog.KObj(cd))
		return liveRecheck, nil
	case err != nil && !apierrors.IsNotFound(err):
		return 0, fmt.Errorf("delete ComputeDomain %s after its last pod: %w", key, err)
	}
	c.forget(key, nil)
	return 0, nil
}

// sawLastPodGone returns when this controller first saw the domain (key,
// uid) without pods, recording now if it had not.
func (c *Controller) sawLastPodGone(key string, uid types.UID, now time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.lastPodGone[key]; ok && s.uid == uid {
		return s.at
	}
	c.lastPodGone[key] = sighting{uid: uid, at: now}
	return now
}

// clearLastPodGone forgets that the domain was seen without pods.
func (c *Controller) clearLastPodGone(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.lastPodGone, key)
}
