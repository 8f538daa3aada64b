package computedomain

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

func withChannel(k int32) func(*gpuv1beta1.ComputeDomain) {
	return func(cd *gpuv1beta1.ComputeDomain) { cd.Status.Channel = ptr.To(k) }
}

func templateMode(cd *gpuv1beta1.ComputeDomain) {
	cd.Spec.Channel = gpuv1beta1.ComputeDomainChannel{ResourceClaimTemplateName: cd.Name + "-channel"}
}

// A new domain gets the smallest channel number no other domain holds, in
// both modes; with every number held it gets none, and neither claim nor
// template.
func TestReserveChannel(t *testing.T) {
	for name, tc := range map[string]struct {
		held []int32 // status.channel of other domains (Channels is 4)
		want *int32
	}{
		"first":     {nil, ptr.To[int32](0)},
		"next":      {[]int32{0, 1}, ptr.To[int32](2)},
		"a gap":     {[]int32{0, 2}, ptr.To[int32](1)},
		"last":      {[]int32{0, 1, 2}, ptr.To[int32](3)},
		"none free": {[]int32{3, 2, 1, 0}, nil},
	} {
		for _, mode := range []string{"claim", "template"} {
			t.Run(name+"/"+mode, func(t *testing.T) {
				var domains []*gpuv1beta1.ComputeDomain
				for i, k := range tc.held {
					domains = append(domains, domain(string(rune('a'+i)), withChannel(k)))
				}
				cd := domain("new")
				if mode == "template" {
					templateMode(cd)
				}
				e := newEnv(t, nil, append(domains, cd)...)
				e.sync(t, "new")
				got := e.get(t, "new")
				if diff := cmp.Diff(tc.want, got.Status.Channel); diff != "" {
					t.Fatalf("status.channel (-want +got):\n%s", diff)
				}
				_, claimErr := e.client.ResourceV1().ResourceClaims(ns).Get(e.ctx, "new-channel", metav1.GetOptions{})
				_, tmplErr := e.client.ResourceV1().ResourceClaimTemplates(ns).Get(e.ctx, "new-channel", metav1.GetOptions{})
				if tc.want == nil {
					if c := condition(t, got, ConditionReady); c.Reason != ReasonNoFreeChannel || !contains(c.Message, "imexChannelsPerClique") {
						t.Errorf("Ready %+v, want NoFreeChannel naming the chart value", c)
					}
					if claimErr == nil || tmplErr == nil {
						t.Error("a claim or template was created without a channel number")
					}
					return
				}
				if created := map[string]error{"claim": claimErr, "template": tmplErr}[mode]; created != nil {
					t.Errorf("no %s: %v", mode, created)
				}
			})
		}
	}
}

// Domains synced one after the other never share a number, whatever their
// mode, and a synced domain keeps its number.
func TestReserveChannelUnique(t *testing.T) {
	e := newEnv(t, nil, domain("a"), domain("b", templateMode), domain("c"), domain("d", templateMode))
	seen := map[int32]string{}
	for _, name := range []string{"a", "b", "c", "d", "a", "b"} {
		e.sync(t, name)
		k := e.get(t, name).Status.Channel
		if k == nil {
			t.Fatalf("%s has no channel", name)
		}
		if other, ok := seen[*k]; ok && other != name {
			t.Errorf("%s and %s both hold channel %d", other, name, *k)
		}
		seen[*k] = name
	}
}

// freezeDomains replaces the controller's domain cache by a snapshot of the
// domains now, as a new leader's lagging cache.
func (e *env) freezeDomains(t *testing.T) {
	t.Helper()
	list, err := e.dyn.Resource(gpuv1beta1.ComputeDomainResource).Namespace(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for i := range list.Items {
		if err := indexer.Add(&list.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
	e.ctrl.lister = cache.NewGenericLister(indexer, gpuv1beta1.ComputeDomainResource.GroupResource())
}

// setChannel writes status.channel through the API, as another (earlier)
// leader did.
func (e *env) setChannel(t *testing.T, name string, k int32) {
	t.Helper()
	domains := e.dyn.Resource(gpuv1beta1.ComputeDomainResource).Namespace(ns)
	u, err := domains.Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(u.Object, int64(k), "status", "channel"); err != nil {
		t.Fatal(err)
	}
	if _, err := domains.UpdateStatus(e.ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// A leader whose cache does not show the numbers an earlier leader
// reserved neither hands out another domain's number nor reserves a
// second number for a domain that has one.
func TestReserveChannelStaleCache(t *testing.T) {
	e := newEnv(t, nil, domain("a"), domain("b", templateMode), domain("c"))
	e.freezeDomains(t)
	e.setChannel(t, "a", 0)
	e.setChannel(t, "c", 2)

	// b: the cache shows no number anywhere; the API server has 0 and 2.
	if _, err := e.ctrl.Sync(e.ctx, ns+"/b"); err != nil {
		t.Fatal(err)
	}
	if k := e.get(t, "b").Status.Channel; k == nil || *k != 1 {
		t.Errorf("b got channel %v, want 1 (0 and 2 are held in the API server, not in the cache)", k)
	}
	// c: its own number is not in the cache; the write's precondition fails.
	_, err := e.ctrl.Sync(e.ctx, ns+"/c")
	if !apierrors.IsConflict(err) {
		t.Errorf("sync of c with a stale cache: %v, want a conflict", err)
	}
	if k := e.get(t, "c").Status.Channel; k == nil || *k != 2 {
		t.Errorf("c has channel %v after a stale sync, want 2 still", k)
	}
}

// A domain from before channel numbers, whose shared claim is allocated,
// adopts the channel of its allocation and keeps its claim; one whose claim
// is not allocated gets a free number.
func TestReserveChannelAdoptsAllocation(t *testing.T) {
	legacy := func(name string, device string) runtime.Object {
		cd := domain(name)
		claim := ChannelClaim(cd, driver, 0)
		claim.Spec.Devices.Requests[0].Exactly.Selectors = nil // as created before channel numbers
		if device != "" {
			claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{Request: ChannelRequest, Driver: driver, Pool: "imex-channels.cluster.1", Device: device}},
			}}
		}
		return claim
	}
	e := newEnv(t, []runtime.Object{legacy("old", "channel-0"), legacy("older", "channel-3"), legacy("pending", "")},
		domain("old"), domain("older"), domain("pending"))
	for _, tc := range []struct {
		name string
		want int32
	}{{"older", 3}, {"old", 0}, {"pending", 1}} {
		before := e.claim(t, tc.name+"-channel")
		e.sync(t, tc.name)
		if k := e.get(t, tc.name).Status.Channel; k == nil || *k != tc.want {
			t.Errorf("%s: status.channel %v, want %d", tc.name, k, tc.want)
		}
		if after := e.claim(t, tc.name+"-channel"); after.ResourceVersion != before.ResourceVersion {
			t.Errorf("%s: the claim was rewritten", tc.name)
		}
	}
}

// The adoption reads the claim from the API server: a cache that does not
// show its allocation yet does not make the domain reserve another number.
func TestReserveChannelAdoptsLiveAllocation(t *testing.T) {
	cd := domain("old")
	claim := ChannelClaim(cd, driver, 0)
	claim.Spec.Devices.Requests[0].Exactly.Selectors = nil // as created before channel numbers
	e := newEnv(t, []runtime.Object{claim}, cd)
	e.freezeClaims(t)
	live := e.claim(t, "old-channel")
	live.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: ChannelRequest, Driver: driver, Pool: "imex-channels.cluster.1", Device: "channel-2"}},
	}}
	if _, err := e.client.ResourceV1().ResourceClaims(ns).UpdateStatus(e.ctx, live, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.sync(t, "old")
	if k := e.get(t, "old").Status.Channel; k == nil || *k != 2 {
		t.Errorf("status.channel %v, want 2 (the API server's allocation; the cache shows none)", k)
	}
}

// The template is the domain's, for its channel number, with the same
// claim spec a shared claim has; a template of that name that is not the
// domain's is left alone.
func TestChannelTemplate(t *testing.T) {
	e := newEnv(t, nil, domain("a", withChannel(0)), domain("train", templateMode))
	e.sync(t, "train")
	got, err := e.client.ResourceV1().ResourceClaimTemplates(ns).Get(e.ctx, "train-channel", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cd := e.get(t, "train")
	if !metav1.IsControlledBy(got, cd) {
		t.Errorf("template owners %+v, want the domain", got.OwnerReferences)
	}
	want := ChannelClaimSpec(cd, driver, 1)
	if diff := cmp.Diff(want, got.Spec.Spec); diff != "" {
		t.Errorf("template spec (-want +got):\n%s", diff)
	}
	if sel := got.Spec.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression; sel != `device.attributes["gpu.dra.dev"].channel == 1` {
		t.Errorf("selector %s", sel)
	}
	if _, err := e.client.ResourceV1().ResourceClaims(ns).Get(e.ctx, "train-channel", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("template mode created a shared claim: %v", err)
	}
	if c := condition(t, cd, ConditionReady); c.Reason != ReasonNoNodes {
		t.Errorf("Ready %+v, want NoNodes", c)
	}

	foreign := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "taken-channel", Namespace: ns}}
	e = newEnv(t, []runtime.Object{foreign}, domain("taken", templateMode))
	e.sync(t, "taken")
	if c := condition(t, e.get(t, "taken"), ConditionReady); c.Reason != ReasonClaimConflict || !contains(c.Message, "ResourceClaimTemplate team/taken-channel") {
		t.Errorf("Ready %+v, want ClaimConflict naming the template", c)
	}
}

func TestChannelSelectorDriverName(t *testing.T) {
	if got, want := ChannelSelector("gpu.nvidia.com", 7), `device.attributes["gpu.nvidia.com"].channel == 7`; got != want {
		t.Errorf("ChannelSelector = %s, want %s", got, want)
	}
}
