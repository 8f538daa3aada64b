package coexistence

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
)

// recorder is a Target that keeps what it was asked to publish.
type recorder struct {
	mu   sync.Mutex
	pubs []int // number of pools of each publication
	fail error
}

func (r *recorder) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.pubs = append(r.pubs, len(res.Pools))
	return nil
}

func (r *recorder) published() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.pubs)
}

func node(allocatable map[string]string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "uid-1"}}
	n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16")}
	for k, v := range allocatable {
		n.Status.Allocatable[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return n
}

var devices = resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{"node-1": {
	Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{{Name: "gpu-0"}}}},
}}}

func TestConflicts(t *testing.T) {
	for name, tc := range map[string]struct {
		allocatable map[string]string
		want        []string
	}{
		"none":                     {},
		"whole GPUs":               {allocatable: map[string]string{"nvidia.com/gpu": "8"}, want: []string{"nvidia.com/gpu=8"}},
		"stopped plugin: 0 left":   {allocatable: map[string]string{"nvidia.com/gpu": "0"}},
		"renamed shares and MIG":   {allocatable: map[string]string{"nvidia.com/gpu.shared": "32", "nvidia.com/mig-1g.10gb": "7"}, want: []string{"nvidia.com/gpu.shared=32", "nvidia.com/mig-1g.10gb=7"}},
		"other vendors' resources": {allocatable: map[string]string{"example.com/gpu": "1", "nvidia.com/gpus": "1"}},
	} {
		t.Run(name, func(t *testing.T) {
			if got := Conflicts(node(tc.allocatable)); !slices.Equal(got, tc.want) {
				t.Errorf("Conflicts = %v, want %v", got, tc.want)
			}
		})
	}
}

// The Gate publishes nothing before the Node was read or while a device
// plugin advertises GPUs, withdraws what it published when one appears and
// publishes again when it is gone, with one event per change.
func TestGate(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(node(nil))
	apiserver.GenerateNames(client) // events are created with generateName
	target := &recorder{}
	g := New(Options{Client: client, NodeName: "node-1", DriverName: "gpu.dra.dev", Target: target, Period: time.Hour})

	if err := g.PublishResources(ctx, devices); err != nil || len(target.published()) != 0 {
		t.Fatalf("before the Node was read: published %v (err %v), want nothing", target.published(), err)
	}
	steps := []struct {
		name        string
		allocatable map[string]string
		wantPubs    []int // all publications so far: pool counts
		wantEvents  []string
	}{
		{name: "no device plugin: publishes", wantPubs: []int{1}},
		{name: "device plugin appears: withdraws", allocatable: map[string]string{"nvidia.com/gpu": "8"},
			wantPubs: []int{1, 0}, wantEvents: []string{ReasonConflict}},
		{name: "still there: nothing new", allocatable: map[string]string{"nvidia.com/gpu": "8"},
			wantPubs: []int{1, 0}, wantEvents: []string{ReasonConflict}},
		{name: "stopped, capacity left, allocatable 0: publishes", allocatable: map[string]string{"nvidia.com/gpu": "0"},
			wantPubs: []int{1, 0, 1}, wantEvents: []string{ReasonConflict, ReasonResolved}},
	}
	for _, s := range steps {
		if _, err := client.CoreV1().Nodes().Update(ctx, node(s.allocatable), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		g.check(ctx)
		if got := target.published(); !slices.Equal(got, s.wantPubs) {
			t.Errorf("%s: publications %v, want %v", s.name, got, s.wantPubs)
		}
		if got := eventReasons(t, ctx, client); !slices.Equal(got, s.wantEvents) {
			t.Errorf("%s: events %v, want %v", s.name, got, s.wantEvents)
		}
	}
	// While in conflict, new publications (health changes) stay unpublished
	// and the latest is what comes back.
	if _, err := client.CoreV1().Nodes().Update(ctx, node(map[string]string{"nvidia.com/mig-1g.10gb": "1"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	g.check(ctx)
	two := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{"a": {}, "b": {}}}
	if err := g.PublishResources(ctx, two); err != nil {
		t.Fatal(err)
	}
	if got := g.Conflicts(); !slices.Equal(got, []string{"nvidia.com/mig-1g.10gb=1"}) {
		t.Errorf("Conflicts() = %v", got)
	}
	if _, err := client.CoreV1().Nodes().Update(ctx, node(nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	g.check(ctx)
	if got, want := target.published(), []int{1, 0, 1, 0, 2}; !slices.Equal(got, want) {
		t.Errorf("after a conflict with a publication in between: %v, want %v", got, want)
	}
}

// A withdrawal that fails is retried at the next read, so stale devices do
// not stay published.
func TestGateRetriesWithdrawal(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(node(map[string]string{"nvidia.com/gpu": "1"}))
	target := &recorder{fail: errors.New("API down")}
	g := New(Options{Client: client, NodeName: "node-1", DriverName: "gpu.dra.dev", Target: target, Period: time.Hour})
	g.check(ctx)
	target.mu.Lock()
	target.fail = nil
	target.mu.Unlock()
	g.check(ctx)
	if got := target.published(); !slices.Equal(got, []int{0}) {
		t.Errorf("publications %v, want the withdrawal retried once", got)
	}
}

// Run keeps reading the Node: a device plugin removed later lets it publish.
func TestGateRun(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset(node(map[string]string{"nvidia.com/gpu": "1"}))
	target := &recorder{}
	g := New(Options{Client: client, NodeName: "node-1", DriverName: "gpu.dra.dev", Target: target, Period: 10 * time.Millisecond})
	if err := g.PublishResources(ctx, devices); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	if _, err := client.CoreV1().Nodes().Update(ctx, node(nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !slices.Contains(target.published(), 1) {
		if time.Now().After(deadline) {
			t.Fatalf("not published after the device plugin left: %v", target.published())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}

func eventReasons(t *testing.T, ctx context.Context, client *fake.Clientset) []string {
	t.Helper()
	evs, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != "node-1" {
			t.Errorf("event %s is not on the Node: %+v", e.Reason, e.InvolvedObject)
		}
		out = append(out, e.Reason)
	}
	slices.Sort(out) // ReasonConflict < ReasonResolved alphabetically too
	return out
}
