package computedomain

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// prune removes the node entries whose node has had no pod of the domain
// for PruneGracePeriod, and returns the entries left and when to look
// again. podNodes come from the cached claims; before removing an entry it
// reads the claims from the API server (domainClaims.live), so a cache that
// lags behind a new pod never removes that pod's node.
func (c *Controller) prune(ctx context.Context, key string, cd *gpuv1beta1.ComputeDomain, claims domainClaims, podNodes sets.Set[string]) ([]gpuv1beta1.ComputeDomainNode, time.Duration, error) {
	now := c.opts.Now()
	var keep []gpuv1beta1.ComputeDomainNode
	var after time.Duration
	present := sets.New[string]()
	var live sets.Set[string] // read once, on the first entry to remove
	for _, n := range cd.Status.Nodes {
		present.Insert(n.Name)
		if podNodes.Has(n.Name) {
			c.forget(key, &n.Name)
			keep = append(keep, n)
			continue
		}
		c.mu.Lock()
		since, ok := c.noPodsSince[key+"/"+n.Name]
		if !ok {
			since = now
			c.noPodsSince[key+"/"+n.Name] = now
		}
		c.mu.Unlock()
		if wait := since.Add(c.opts.PruneGracePeriod).Sub(now); wait > 0 {
			keep = append(keep, n)
			after = minPositive(after, wait)
			continue
		}
		if live == nil {
			nodes, err := c.livePodNodes(ctx, cd, claims)
			if err != nil {
				return nil, 0, err
			}
			if nodes == nil { // the cache is not the API server's claims: prune nothing now
				return cd.Status.Nodes, liveRecheck, nil
			}
			live = nodes
		}
		if live.Has(n.Name) { // the cache lags: the node has a pod again
			c.forget(key, &n.Name)
			keep = append(keep, n)
			continue
		}
		if err := c.removeNode(ctx, cd, n.Name); err != nil {
			return nil, 0, err
		}
		klog.FromContext(ctx).Info("Removed the entry of a node without pods of the domain", "domain", klog.KObj(cd), "node", n.Name, "since", since)
		c.forget(key, &n.Name)
	}
	// Forget nodes whose entries are gone.
	c.mu.Lock()
	for k := range c.noPodsSince {
		if node, ok := cutKey(k, key); ok && !present.Has(node) {
			delete(c.noPodsSince, k)
		}
	}
	c.mu.Unlock()
	return keep, after, nil
}

// livePodNodes reads the domain's claims from the API server and returns
// the nodes of the pods they are reserved for; nil when the shared claim
// is gone or is not the cached one (another UID).
func (c *Controller) livePodNodes(ctx context.Context, cd *gpuv1beta1.ComputeDomain, claims domainClaims) (sets.Set[string], error) {
	live, ok, err := claims.live(ctx)
	if !ok || err != nil {
		return nil, err
	}
	return c.podNodes(ctx, cd.Namespace, podsOf(live...))
}

// liveClaim reads the domain's claim from the API server, bypassing the
// cache. It returns nil (and logs why) when the claim is gone or is not
// the cached one.
func (c *Controller) liveClaim(ctx context.Context, cd *gpuv1beta1.ComputeDomain, cached *resourceapi.ResourceClaim) (*resourceapi.ResourceClaim, error) {
	claim, err := c.client.ResourceV1().ResourceClaims(cd.Namespace).Get(ctx, cached.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		klog.FromContext(ctx).V(2).Info("Channel claim in the cache is gone from the API server", "domain", klog.KObj(cd), "claim", klog.KObj(cached))
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read channel claim %s/%s: %w", cd.Namespace, cached.Name, err)
	}
	if claim.UID != cached.UID || !metav1.IsControlledBy(claim, cd) {
		klog.FromContext(ctx).V(2).Info("Channel claim in the cache is not the API server's", "domain", klog.KObj(cd), "claim", klog.KObj(cached),
			"cachedUID", cached.UID, "uid", claim.UID)
		return nil, nil
	}
	return claim, nil
}

// removeNode drops a node's entry as its own plugin does: an empty list
// applied as the node's field manager.
func (c *Controller) removeNode(ctx context.Context, cd *gpuv1beta1.ComputeDomain, node string) error {
	patch := applyObject(cd)
	patch.Object["status"] = map[string]any{"nodes": []any{}}
	_, err := c.domains.Namespace(cd.Namespace).ApplyStatus(ctx, cd.Name, patch, metav1.ApplyOptions{FieldManager: NodeFieldManager(node), Force: true})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove node %s from ComputeDomain %s/%s: %w", node, cd.Namespace, cd.Name, err)
	}
	return nil
}
