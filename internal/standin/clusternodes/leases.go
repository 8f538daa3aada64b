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
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// leaseRenewPeriod is how often a stand-in node renews its Lease: the node
// lifecycle controller marks a node unreachable after 50 s (its default
// grace period) without a renewal, and a loaded API server takes a second
// or more per request.
const leaseRenewPeriod = 5 * time.Second

// leaseDurationSeconds is the kubelet's default node Lease duration.
const leaseDurationSeconds = 40

// RenewLeases keeps the nodes' Leases fresh until stop is called, so the node
// lifecycle controller does not taint them unreachable. Each node runs the
// kubelet's own node Lease controller: a pass over a hundred nodes one
// request after another outlasted the grace period on a loaded API server,
// and the nodes at the end of the list went unreachable in the middle of a
// benchmark.
func RenewLeases(ctx context.Context, client kubernetes.Interface, nodes []string) (stop func()) {
	return renewLeases(ctx, client, nodes, leaseRenewPeriod)
}

func renewLeases(ctx context.Context, client kubernetes.Interface, nodes []string, period time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, n := range nodes {
		c := lease.NewController(clock.RealClock{}, client, n, leaseDurationSeconds, nil, period, n, corev1.NamespaceNodeLease, nil)
		wg.Go(func() { c.Run(ctx) })
	}
	return func() { cancel(); wg.Wait() }
}

// createLease creates node's Lease as its kubelet would, renewed now; one
// that exists already is left to RenewLeases.
func createLease(ctx context.Context, client kubernetes.Interface, node string) error {
	now := metav1.NewMicroTime(time.Now())
	_, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](leaseDurationSeconds), RenewTime: &now},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the Lease of node %s: %w", node, err)
	}
	return nil
}
