// Package apiserver makes client-go's fake clientset behave like the API
// server where tests of the driver depend on it.
package apiserver

import (
	"fmt"
	"slices"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// GenerateNames makes client name objects created with generateName the way
// the API server does; the fake object tracker ignores generateName.
func GenerateNames(client *fake.Clientset) {
	var n atomic.Int64
	client.PrependReactor("create", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if obj, err := meta.Accessor(action.(k8stesting.CreateAction).GetObject()); err == nil && obj.GetName() == "" && obj.GetGenerateName() != "" {
			i := n.Add(1)
			obj.SetName(fmt.Sprintf("%s%05d", obj.GetGenerateName(), i))
			if obj.GetUID() == "" {
				obj.SetUID(types.UID(fmt.Sprintf("generated-uid-%05d", i)))
			}
		}
		return false, nil, nil
	})
}

// NodeClient returns a clientset holding the node and the claims that names
// objects created with generateName: what the kubelet plugin of that node
// reads and writes.
func NodeClient(node string, claims ...*resourceapi.ResourceClaim) *fake.Clientset {
	objs := []runtime.Object{&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}}
	for _, c := range claims {
		objs = append(objs, c)
	}
	client := fake.NewClientset(objs...)
	GenerateNames(client)
	return client
}

// RecordFieldManager makes client's creates and updates of resource that
// name no field manager record manager in the object's managedFields, as
// the API server records the writer's user agent; the fake's tracker would
// record none. Call it before GenerateNames, whose names it then keeps.
func RecordFieldManager(client *fake.Clientset, resource, manager string) {
	record := func(action k8stesting.Action) (bool, runtime.Object, error) {
		tracker, gvr, ns := client.Tracker(), action.GetResource(), action.GetNamespace()
		var obj runtime.Object
		var err error
		switch a := action.(type) {
		case k8stesting.CreateActionImpl:
			if a.CreateOptions.FieldManager != "" || a.GetSubresource() != "" {
				return false, nil, nil
			}
			obj = a.GetObject()
			err = tracker.Create(gvr, obj, ns, metav1.CreateOptions{FieldManager: manager})
		case k8stesting.UpdateActionImpl:
			if a.UpdateOptions.FieldManager != "" || a.GetSubresource() != "" {
				return false, nil, nil
			}
			obj = a.GetObject()
			err = tracker.Update(gvr, obj, ns, metav1.UpdateOptions{FieldManager: manager})
		default:
			return false, nil, nil
		}
		if err != nil {
			return true, nil, err
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			return true, nil, err
		}
		stored, err := tracker.Get(gvr, ns, m.GetName())
		return true, stored, err
	}
	client.PrependReactor("create", resource, record)
	client.PrependReactor("update", resource, record)
}

// SliceFieldSelectors makes client's lists and watches of ResourceSlices
// apply their field selectors (spec.driver, spec.nodeName, spec.pool.name)
// as the API server does; the fake object tracker ignores them, so a slice
// controller of one driver would see, and delete, other drivers' slices.
func SliceFieldSelectors(client *fake.Clientset) {
	matches := func(sel fields.Selector, obj runtime.Object) bool {
		s, ok := obj.(*resourceapi.ResourceSlice)
		if !ok || sel == nil {
			return true
		}
		return sel.Matches(fields.Set{
			resourceapi.ResourceSliceSelectorDriver:   s.Spec.Driver,
			resourceapi.ResourceSliceSelectorNodeName: ptr.Deref(s.Spec.NodeName, ""),
			resourceapi.ResourceSliceSelectorPoolName: s.Spec.Pool.Name,
		})
	}
	client.PrependReactor("list", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		la := action.(k8stesting.ListActionImpl)
		obj, err := client.Tracker().List(la.GetResource(), la.GetKind(), la.GetNamespace(), la.ListOptions)
		if err != nil {
			return true, nil, err
		}
		list := obj.(*resourceapi.ResourceSliceList)
		list.Items = slices.DeleteFunc(list.Items, func(s resourceapi.ResourceSlice) bool {
			return !matches(la.ListRestrictions.Fields, &s)
		})
		return true, list, nil
	})
	client.PrependWatchReactor("resourceslices", func(action k8stesting.Action) (bool, watch.Interface, error) {
		wa := action.(k8stesting.WatchActionImpl)
		w, err := client.Tracker().Watch(wa.GetResource(), wa.GetNamespace(), wa.ListOptions)
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			return e, matches(wa.WatchRestrictions.Fields, e.Object)
		}), nil
	})
}
