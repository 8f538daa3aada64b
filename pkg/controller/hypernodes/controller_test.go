package hypernodes

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/modelclasses"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const (
	cliqueA = "6f1c2b7e-0d4a-4c55-9a35-1b2e3c4d5e6f.1"
	cliqueB = "0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d.1"
)

func node(name, clique string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}}}
	if clique != "" {
		n.Labels[vocabulary.LabelClique] = clique
	}
	return n
}

// hyperNode is a HyperNode as another party (or the controller, managed)
// could have written it.
func hyperNode(name, clique string, managed bool, members ...string) *unstructured.Unstructured {
	u := desired(clique, members)
	u.SetName(name)
	if !managed {
		u.SetLabels(map[string]string{"team": "network"})
	}
	return u
}

// fixture is a controller over fake clients; installed switches discovery
// of the HyperNode API.
type fixture struct {
	c         *Controller
	dyn       *dynamicfake.FakeDynamicClient
	client    *fake.Clientset
	disc      *fakediscovery.FakeDiscovery
	installed atomic.Bool
}

func newFixture(t *testing.T, nodes []*corev1.Node, hyperNodes []*unstructured.Unstructured, opts Options) *fixture {
	t.Helper()
	f := &fixture{}
	var objs []runtime.Object
	for _, n := range nodes {
		objs = append(objs, n)
	}
	f.client = fake.NewClientset(objs...)
	disc := f.client.Discovery().(*fakediscovery.FakeDiscovery)
	f.disc = disc
	disc.Resources = []*metav1.APIResourceList{{
		GroupVersion: Resource.GroupVersion().String(),
		APIResources: []metav1.APIResource{{Name: Resource.Resource, Kind: Kind}},
	}}
	disc.PrependReactor("get", "resource", func(k8stesting.Action) (bool, runtime.Object, error) {
		if f.installed.Load() {
			return false, nil, nil
		}
		return true, nil, apierrors.NewNotFound(schema.GroupResource{}, Resource.GroupVersion().String())
	})
	var dynObjs []runtime.Object
	for _, hn := range hyperNodes {
		dynObjs = append(dynObjs, hn)
	}
	f.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{Resource: Kind + "List"}, dynObjs...)
	factory := informers.NewSharedInformerFactory(f.client, 0)
	var err error
	f.c, err = New(disc, f.dyn, factory.Core().V1().Nodes(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := factory.Core().V1().Nodes().Informer().GetIndexer().Add(n); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// hyperNodes returns the HyperNodes by name with their member node names.
func (f *fixture) hyperNodes(t *testing.T, ctx context.Context) map[string]*unstructured.Unstructured {
	t.Helper()
	list, err := f.dyn.Resource(Resource).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*unstructured.Unstructured{}
	for i := range list.Items {
		out[list.Items[i].GetName()] = &list.Items[i]
	}
	return out
}

func members(t *testing.T, hn *unstructured.Unstructured) []string {
	t.Helper()
	ms, _, err := unstructured.NestedSlice(hn.Object, "spec", "members")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range ms {
		mm := m.(map[string]any)
		name, _, _ := unstructured.NestedString(mm, "selector", "exactMatch", "name")
		if mm["type"] != "Node" || name == "" {
			t.Errorf("HyperNode %s: member %v, want a Node by exactMatch", hn.GetName(), mm)
		}
		names = append(names, name)
	}
	return names
}

func TestSync(t *testing.T) {
	rack := []*corev1.Node{node("tray-a1", cliqueA), node("tray-a2", cliqueA), node("tray-b1", cliqueB), node("cpu-1", "")}
	for _, tc := range []struct {
		name       string
		nodes      []*corev1.Node
		hyperNodes []*unstructured.Unstructured
		notServed  bool
		// want maps HyperNode names to their members ("" : not managed,
		// must be as it was).
		want    map[string][]string
		wantErr string
	}{{
		name:      "API not served: nothing",
		nodes:     rack,
		notServed: true,
		want:      map[string][]string{},
	}, {
		name:  "one HyperNode per clique, nodes without a clique in none",
		nodes: rack,
		want:  map[string][]string{Name(cliqueA): {"tray-a1", "tray-a2"}, Name(cliqueB): {"tray-b1"}},
	}, {
		name:  "members follow the nodes; the HyperNode of a clique without nodes goes",
		nodes: []*corev1.Node{node("tray-a1", cliqueA), node("tray-a3", cliqueA), node("tray-b1", cliqueA)},
		hyperNodes: []*unstructured.Unstructured{
			hyperNode(Name(cliqueA), cliqueA, true, "tray-a1", "tray-a2"),
			hyperNode(Name(cliqueB), cliqueB, true, "tray-b1"),
		},
		want: map[string][]string{Name(cliqueA): {"tray-a1", "tray-a3", "tray-b1"}},
	}, {
		name:  "HyperNodes not managed are never touched",
		nodes: rack[:2],
		hyperNodes: []*unstructured.Unstructured{
			hyperNode("leaf-switch-7", cliqueB, false, "tray-b1"),
			hyperNode(Name(cliqueA), cliqueA, false, "someone-else"),
		},
		want:    map[string][]string{"leaf-switch-7": nil, Name(cliqueA): nil},
		wantErr: "exists and is not managed by the driver",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			f := newFixture(t, tc.nodes, tc.hyperNodes, Options{})
			f.installed.Store(!tc.notServed)
			before := map[string]*unstructured.Unstructured{}
			for _, hn := range tc.hyperNodes {
				before[hn.GetName()] = hn
			}
			err := f.c.Sync(ctx)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Sync: %v, want error %q", err, tc.wantErr)
			}
			got := f.hyperNodes(t, ctx)
			if len(got) != len(tc.want) {
				t.Errorf("HyperNodes %v, want %v", keys(got), tc.want)
			}
			for name, want := range tc.want {
				hn := got[name]
				if hn == nil {
					t.Errorf("no HyperNode %s", name)
					continue
				}
				if want == nil {
					if members(t, hn)[0] != members(t, before[name])[0] || hn.GetLabels()[modelclasses.ManagedByLabel] != "" {
						t.Errorf("HyperNode %s not managed was changed: %v", name, hn.Object)
					}
					continue
				}
				if got := members(t, hn); !slices.Equal(got, want) {
					t.Errorf("HyperNode %s members %v, want %v", name, got, want)
				}
				tier, _, _ := unstructured.NestedInt64(hn.Object, "spec", "tier")
				l := hn.GetLabels()
				if tier != Tier || l[modelclasses.ManagedByLabel] != modelclasses.ManagedByValue || l[vocabulary.LabelClique] == "" {
					t.Errorf("HyperNode %s: tier %d, labels %v, want tier %d, managed, with its clique", name, tier, l, Tier)
				}
			}
			// A second sync changes nothing.
			f.dyn.ClearActions()
			if err := f.c.Sync(ctx); (err == nil) != (tc.wantErr == "") {
				t.Fatalf("second Sync: %v", err)
			}
			for _, a := range f.dyn.Actions() {
				if a.GetVerb() != "list" && (tc.wantErr == "" || a.GetVerb() != "create") {
					t.Errorf("second Sync: %s %s, want no change", a.GetVerb(), a.GetResource().Resource)
				}
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestRun: HyperNodes appear once the API is served, without a restart
// (the periodic resync), and follow the nodes' clique labels (node events:
// a long resync does not hide a missing handler).
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		name           string
		installedLater bool
		resync         time.Duration
	}{
		{"Volcano installed later", true, 50 * time.Millisecond},
		{"node events", false, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			f := newFixture(t, nil, nil, Options{})
			f.installed.Store(!tc.installedLater)
			nodes := f.client.CoreV1().Nodes()
			if _, err := nodes.Create(ctx, node("tray-a1", cliqueA), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			// The fixture's indexer-only nodes are not used here: a real informer.
			factory := informers.NewSharedInformerFactory(f.client, 0)
			c, err := New(f.disc, f.dyn, factory.Core().V1().Nodes(), Options{Resync: tc.resync})
			if err != nil {
				t.Fatal(err)
			}
			factory.Start(ctx.Done())
			done := make(chan error)
			go func() { done <- c.Run(ctx) }()

			if tc.installedLater {
				time.Sleep(200 * time.Millisecond)
				if got := f.hyperNodes(t, ctx); len(got) != 0 {
					t.Fatalf("HyperNodes %v before the API is served", keys(got))
				}
				f.installed.Store(true)
			}
			waitMembers(t, ctx, f, Name(cliqueA), "tray-a1")

			if _, err := nodes.Create(ctx, node("tray-a2", cliqueA), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitMembers(t, ctx, f, Name(cliqueA), "tray-a1", "tray-a2")
			if _, err := nodes.Update(ctx, node("tray-a1", cliqueB), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitMembers(t, ctx, f, Name(cliqueA), "tray-a2")
			waitMembers(t, ctx, f, Name(cliqueB), "tray-a1")
			if err := nodes.Delete(ctx, "tray-a1", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			waitGone(t, ctx, f, Name(cliqueB))
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func waitGone(t *testing.T, ctx context.Context, f *fixture, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		return f.hyperNodes(t, ctx)[name] == nil, nil
	})
	if err != nil {
		t.Fatalf("HyperNode %s of a clique without nodes still there", name)
	}
}

func waitMembers(t *testing.T, ctx context.Context, f *fixture, name string, want ...string) {
	t.Helper()
	var got []string
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		hn := f.hyperNodes(t, ctx)[name]
		if hn == nil {
			return false, nil
		}
		got = members(t, hn)
		return slices.Equal(got, want), nil
	})
	if err != nil {
		t.Fatalf("HyperNode %s members %v, want %v", name, got, want)
	}
}

func TestName(t *testing.T) {
	for _, tc := range []struct{ clique, want string }{
		{cliqueA, "nvlink-clique-" + cliqueA},
		{"Rack_A.1", ""},
		{"rack_a.1", ""},
	} {
		got := Name(tc.clique)
		if tc.want != "" && got != tc.want {
			t.Errorf("Name(%q) = %q, want %q", tc.clique, got, tc.want)
		}
		if !strings.HasPrefix(got, namePrefix) || strings.ContainsAny(got, "_ABCDEFGHIJKLMNOPQRSTUVWXYZ") {
			t.Errorf("Name(%q) = %q, not a valid name", tc.clique, got)
		}
	}
	if Name("Rack_A.1") == Name("rack_a.1") {
		t.Errorf("two cliques share the HyperNode name %s", Name("rack_a.1"))
	}
}
