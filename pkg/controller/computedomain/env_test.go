package computedomain

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic/dynamicinformer"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

const (
	driver = "gpu.dra.dev"
	ns     = "team"
)

// env is a controller over fake clients, driven by calling Sync.
type env struct {
	ctx    context.Context
	client *fake.Clientset
	dyn    *dynamicfake.FakeDynamicClient
	ctrl   *Controller
	now    time.Time
	// frozenClaims: the controller's claim cache is a snapshot
	// (freezeClaims), as stale as a lagging watch.
	frozenClaims bool
}

func domain(name string, mutate ...func(*gpuv1beta1.ComputeDomain)) *gpuv1beta1.ComputeDomain {
	cd := &gpuv1beta1.ComputeDomain{
		TypeMeta:   metav1.TypeMeta{APIVersion: gpuv1beta1.GroupVersion.String(), Kind: gpuv1beta1.ComputeDomainKind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: k8stypes.UID("uid-" + name)},
		Spec:       gpuv1beta1.ComputeDomainSpec{Channel: gpuv1beta1.ComputeDomainChannel{ResourceClaimName: name + "-channel"}},
	}
	for _, m := range mutate {
		m(cd)
	}
	return cd
}

func toUnstructured(t *testing.T, obj runtime.Object) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// newEnv starts the controller's informers over typed objects and domains;
// a second env over the same clients is a restarted controller.
func newEnv(t *testing.T, typed []runtime.Object, domains ...*gpuv1beta1.ComputeDomain) *env {
	var objs []runtime.Object
	for _, cd := range domains {
		objs = append(objs, toUnstructured(t, cd))
	}
	client := fake.NewClientset(typed...)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{gpuv1beta1.ComputeDomainResource: "ComputeDomainList"}, objs...)
	applyAsServer(dyn)
	deleteAsServer(dyn)
	updateAsServer(dyn)
	return startEnv(t, client, dyn, time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
}

func startEnv(t *testing.T, client *fake.Clientset, dyn *dynamicfake.FakeDynamicClient, now time.Time) *env {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	e := &env{ctx: ctx, client: client, dyn: dyn, now: now}
	typedFactory := informers.NewSharedInformerFactory(client, 0)
	dynFactory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	c, err := New(client, dyn, dynFactory.ForResource(gpuv1beta1.ComputeDomainResource), typedFactory.Resource().V1().ResourceClaims(),
		Options{DriverName: driver, Channels: 4, PruneGracePeriod: time.Minute, Now: func() time.Time { return e.now }})
	if err != nil {
		t.Fatal(err)
	}
	typedFactory.Start(ctx.Done())
	dynFactory.Start(ctx.Done())
	typedFactory.WaitForCacheSync(ctx.Done())
	dynFactory.WaitForCacheSync(ctx.Done())
	t.Cleanup(func() { cancel(); typedFactory.Shutdown(); dynFactory.Shutdown() })
	e.ctrl = c
	return e
}

// sync waits until the caches hold what the clients hold, then syncs the
// domain.
func (e *env) sync(t *testing.T, name string) time.Duration {
	t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 5*time.Millisecond, 5*time.Second, true, func(ctx context.Context) (bool, error) {
		cur, err := e.dyn.Resource(gpuv1beta1.ComputeDomainResource).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		cached, cerr := e.ctrl.lister.ByNamespace(ns).Get(name)
		if err != nil || cerr != nil {
			return err != nil && cerr != nil, nil // both gone
		}
		// The fake tracker keeps no resource versions: compare the objects.
		if !equality.Semantic.DeepEqual(cur.Object, cached.(*unstructured.Unstructured).Object) {
			return false, nil
		}
		if e.frozenClaims {
			return true, nil
		}
		claims, err := e.client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range claims.Items {
			got, err := e.ctrl.claims.ResourceClaims(ns).Get(c.Name)
			if err != nil || !equality.Semantic.DeepEqual(got, &c) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("caches: %v", err)
	}
	after, err := e.ctrl.Sync(e.ctx, ns+"/"+name)
	if err != nil {
		t.Fatalf("sync %s: %v", name, err)
	}
	return after
}

// get reads a domain back.
func (e *env) get(t *testing.T, name string) *gpuv1beta1.ComputeDomain {
	t.Helper()
	u, err := e.dyn.Resource(gpuv1beta1.ComputeDomainResource).Namespace(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cd := &gpuv1beta1.ComputeDomain{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cd); err != nil {
		t.Fatal(err)
	}
	return cd
}

// applyAsServer makes the fake dynamic client apply status as the API
// server does for this CRD's map lists: an applied condition replaces the
// one of its type; a node's field manager (NodeFieldManager) owns its own
// entry of status.nodes, so applying its list replaces only that entry.
func applyAsServer(dyn *dynamicfake.FakeDynamicClient) {
	dyn.PrependReactor("patch", "computedomains", func(action k8stesting.Action) (bool, runtime.Object, error) {
		p := action.(k8stesting.PatchActionImpl)
		if p.GetSubresource() != "status" || p.GetPatchType() != "application/apply-patch+yaml" {
			return false, nil, nil
		}
		tracker := dyn.Tracker()
		obj, err := tracker.Get(p.GetResource(), p.GetNamespace(), p.GetName())
		if err != nil {
			return true, nil, err
		}
		u := obj.(*unstructured.Unstructured).DeepCopy()
		patch := &unstructured.Unstructured{}
		if err := patch.UnmarshalJSON(p.GetPatch()); err != nil {
			return true, nil, err
		}
		manager := p.PatchOptions.FieldManager
		mergeList := func(field, key string, drop func(map[string]any) bool) {
			applied, ok, _ := unstructured.NestedSlice(patch.Object, "status", field)
			if !ok {
				return
			}
			cur, _, _ := unstructured.NestedSlice(u.Object, "status", field)
			var out []any
			for _, item := range cur {
				m := item.(map[string]any)
				replaced := drop(m)
				for _, a := range applied {
					replaced = replaced || a.(map[string]any)[key] == m[key]
				}
				if !replaced {
					out = append(out, item)
				}
			}
			out = append(out, applied...)
			_ = unstructured.SetNestedSlice(u.Object, out, "status", field)
		}
		mergeList("conditions", "type", func(map[string]any) bool { return false })
		mergeList("nodes", "name", func(m map[string]any) bool { return NodeFieldManager(m["name"].(string)) == manager })
		bumpResourceVersion(u)
		if err := tracker.Update(p.GetResource(), u, p.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, u, nil
	})
}

// bumpResourceVersion gives a written domain a new resource version, which
// the fake tracker does not.
func bumpResourceVersion(u *unstructured.Unstructured) {
	rv, _ := strconv.Atoi(u.GetResourceVersion())
	u.SetResourceVersion(strconv.Itoa(rv + 1))
}

// updateAsServer makes the fake dynamic client check an update's resource
// version, the optimistic lock, and bump it, as the API server does.
func updateAsServer(dyn *dynamicfake.FakeDynamicClient) {
	dyn.PrependReactor("update", "computedomains", func(action k8stesting.Action) (bool, runtime.Object, error) {
		u := action.(k8stesting.UpdateActionImpl).GetObject().(*unstructured.Unstructured).DeepCopy()
		obj, err := dyn.Tracker().Get(gpuv1beta1.ComputeDomainResource, u.GetNamespace(), u.GetName())
		if err != nil {
			return true, nil, err
		}
		if cur := obj.(*unstructured.Unstructured).GetResourceVersion(); u.GetResourceVersion() != cur {
			return true, nil, apierrors.NewConflict(gpuv1beta1.ComputeDomainResource.GroupResource(), u.GetName(),
				fmt.Errorf("the object has been modified: resourceVersion %q, have %q", u.GetResourceVersion(), cur))
		}
		bumpResourceVersion(u)
		return true, u, dyn.Tracker().Update(gpuv1beta1.ComputeDomainResource, u, u.GetNamespace())
	})
}

// deleteAsServer makes the fake dynamic client check a delete's
// preconditions (UID, resource version) as the API server does.
func deleteAsServer(dyn *dynamicfake.FakeDynamicClient) {
	dyn.PrependReactor("delete", "computedomains", func(action k8stesting.Action) (bool, runtime.Object, error) {
		d := action.(k8stesting.DeleteActionImpl)
		pre := d.DeleteOptions.Preconditions
		if pre == nil {
			return false, nil, nil
		}
		obj, err := dyn.Tracker().Get(d.GetResource(), d.GetNamespace(), d.GetName())
		if err != nil {
			return true, nil, err
		}
		u := obj.(*unstructured.Unstructured)
		if pre.UID != nil && *pre.UID != u.GetUID() || pre.ResourceVersion != nil && *pre.ResourceVersion != u.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(gpuv1beta1.ComputeDomainResource.GroupResource(), d.GetName(),
				fmt.Errorf("precondition failed: UID %v, resourceVersion %v; have %s, %s", ptr.Deref(pre.UID, ""), ptr.Deref(pre.ResourceVersion, ""), u.GetUID(), u.GetResourceVersion()))
		}
		return false, nil, nil
	})
}

// freezeClaims replaces the controller's claim cache by a snapshot of the
// claims now: later claim changes reach the API only, as with a lagging
// watch.
func (e *env) freezeClaims(t *testing.T) {
	t.Helper()
	list, err := e.client.ResourceV1().ResourceClaims(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for i := range list.Items {
		if err := indexer.Add(&list.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
	e.ctrl.claims = resourcelisters.NewResourceClaimLister(indexer)
	e.frozenClaims = true
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func k8sUID(s string) k8stypes.UID { return k8stypes.UID("uid-" + s) }

func isExists(err error) bool   { return apierrors.IsAlreadyExists(err) }
func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
