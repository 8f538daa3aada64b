package prepare

import (
	"context"
	"fmt"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// ReleaseClaim unprepares a claim the kubelet will never unprepare (its
// ResourceClaim is gone while the kubelet lost its own record of it;
// pkg/staleclaims decides that), the way UnprepareResourceClaims does. It
// takes the claim's lock first, which every prepare and unprepare of the
// claim holds, then calls stillStale: a nil error lets the release go on,
// any other is returned as is and nothing changes. So a prepare in flight
// finishes before stillStale looks at the claim again, and one that comes
// later finds the claim unprepared and prepares it afresh. A claim that is
// not prepared is released at once (its CDI spec is removed if one is left).
func (d *Engine) ReleaseClaim(ctx context.Context, claim kubeletplugin.NamespacedObject, stillStale func(context.Context) error) error {
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("stale", true))
	defer d.inflight.begin("stale release of claim " + claim.String())()
	unlock := d.claimLocks.Lock(string(claim.UID))
	defer unlock()
	if ctx.Err() != nil { // shutting down: the next owner of the node decides
		return fmt.Errorf("release stale claim %s: %w", claim, context.Cause(ctx))
	}
	if err := stillStale(ctx); err != nil {
		return err
	}
	start, kind := time.Now(), d.claimKind(claim.UID)
	err := d.unprepareLocked(ctx, claim)
	d.observe(false, kind, start, err)
	if err != nil {
		return fmt.Errorf("release stale claim %s: %w", claim, err)
	}
	d.attribution.Forget(claim.UID)
	d.finishTeardowns(ctx)
	return nil
}
