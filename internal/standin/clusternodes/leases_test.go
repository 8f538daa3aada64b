package clusternodes

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// One node's slow Lease request must not hold up another's: the API server
// here answers no Lease request until every node has sent one (a server
// so loaded that each request waits), so nodes renewed one after another
// never get a Lease. Nodes that were then renewed keep being renewed, and
// a Lease deleted under them is created again.
func TestLeasesRenewedSideBySide(t *testing.T) {
	nodes := make([]string, 20)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%02d", i)
	}
	fakeClient := fake.NewClientset()
	client := &barrierClient{Interface: fakeClient, barrier: newBarrier(len(nodes), 5*time.Second)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := renewLeases(ctx, client, nodes, 100*time.Millisecond)
	defer stop()

	leases := fakeClient.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	first := map[string]time.Time{}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, n := range nodes {
			l, err := leases.Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			first[n] = l.Spec.RenewTime.Time
		}
		return true, nil
	}); err != nil {
		t.Fatalf("%d of %d nodes have a Lease: %v", len(first), len(nodes), err)
	}
	if err := leases.Delete(ctx, nodes[0], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, n := range nodes {
			l, err := leases.Get(ctx, n, metav1.GetOptions{})
			if err != nil || !l.Spec.RenewTime.After(first[n]) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("not every Lease renewed (the deleted one created again): %v", err)
	}
	stop()
	l, err := leases.Get(context.Background(), nodes[1], metav1.GetOptions{})
	if err != nil || *l.Spec.HolderIdentity != nodes[1] || *l.Spec.LeaseDurationSeconds != 40 {
		t.Errorf("Lease of %s: %+v, %v", nodes[1], l, err)
	}
}

// barrier holds every caller until n distinct names have come, or fails
// them after timeout.
type barrier struct {
	mu      sync.Mutex
	seen    map[string]bool
	n       int
	all     chan struct{}
	timeout time.Duration
}

func newBarrier(n int, timeout time.Duration) *barrier {
	return &barrier{seen: map[string]bool{}, n: n, all: make(chan struct{}), timeout: timeout}
}

func (b *barrier) wait(ctx context.Context, name string) error {
	b.mu.Lock()
	if !b.seen[name] {
		b.seen[name] = true
		if len(b.seen) == b.n {
			close(b.all)
		}
	}
	b.mu.Unlock()
	select {
	case <-b.all:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(b.timeout):
		return fmt.Errorf("Lease of %s: no answer while other nodes have not asked", name)
	}
}

// barrierClient passes its Lease requests through a barrier.
type barrierClient struct {
	kubernetes.Interface
	barrier *barrier
}

func (c *barrierClient) CoordinationV1() coordinationclient.CoordinationV1Interface {
	return barrierCoordination{c.Interface.CoordinationV1(), c.barrier}
}

type barrierCoordination struct {
	coordinationclient.CoordinationV1Interface
	barrier *barrier
}

func (c barrierCoordination) Leases(namespace string) coordinationclient.LeaseInterface {
	return barrierLeases{c.CoordinationV1Interface.Leases(namespace), c.barrier}
}

type barrierLeases struct {
	coordinationclient.LeaseInterface
	barrier *barrier
}

func (l barrierLeases) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	if err := l.barrier.wait(ctx, name); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Get(ctx, name, opts)
}

func (l barrierLeases) Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if err := l.barrier.wait(ctx, lease.Name); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Create(ctx, lease, opts)
}

func (l barrierLeases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if err := l.barrier.wait(ctx, lease.Name); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Update(ctx, lease, opts)
}
