package clusternodes

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// leaseRenewPeriod is how often a stand-in node renews its Lease: the node
// lifecycle controller marks a node unreachable after 50 s (its default
// grace period) without a renewal, and a loaded API server takes a second
// or more per request.
const leaseRenewPeriod = 5 * time.Second

// RenewLeases keeps the nodes' Leases fresh until stop is called, so the node
// lifecycle controller does not taint them unreachable. Each node renews on
// its own: a pass over a hundred nodes one request after another outlasted
// the grace period on a loaded API server, and the nodes at the end of the
// list went unreachable in the middle of a benchmark.
func RenewLeases(ctx context.Context, client kubernetes.Interface, nodes []string) (stop func()) {
	return renewLeases(ctx, client, nodes, leaseRenewPeriod)
}

func renewLeases(ctx context.Context, client kubernetes.Interface, nodes []string, period time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Go(func() {
			var lease *coordinationv1.Lease
			// Jitter spreads the nodes' renewals over the period.
			wait.JitterUntilWithContext(ctx, func(ctx context.Context) {
				lease, _ = renewLease(ctx, client, n, lease) // the next period tries again
			}, period, 0.2, true)
		})
	}
	return func() { cancel(); wg.Wait() }
}

// renewLease renews node's Lease, last as this node stored it (nil when not
// known), and returns it as stored now: an update from what it stored saves
// a read, a conflict reads it again, and a Lease that is gone is created.
func renewLease(ctx context.Context, client kubernetes.Interface, node string, last *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	leases := client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	if last != nil {
		l := last.DeepCopy()
		l.Spec.RenewTime = &now
		if stored, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err == nil {
			return stored, nil
		}
	}
	l, err := leases.Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		stored, err := leases.Create(ctx, nodeLease(node, now), metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("create the Lease of node %s: %w", node, err)
		}
		return stored, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the Lease of node %s: %w", node, err)
	}
	l.Spec.RenewTime = &now
	stored, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("renew the Lease of node %s: %w", node, err)
	}
	return stored, nil
}

// nodeLease is node's Lease as its kubelet would create it.
func nodeLease(node string, renewed metav1.MicroTime) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &renewed},
	}
}
