package apiserver

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// ComputeDomains returns a dynamic client holding the ComputeDomains, whose
// status subresource takes server-side apply of status.nodes as the API
// server does for the CRD's list map keyed by name: each field manager owns
// the entries it applied, and an apply replaces that manager's entries and
// no other's. (The fake tracker would merge-patch the whole list.) An apply
// whose metadata.uid differs from the object's is a conflict.
func ComputeDomains(cds ...*gpuv1beta1.ComputeDomain) (*dynamicfake.FakeDynamicClient, error) {
	// An empty scheme: the fake lists unstructured objects, as a dynamic
	// client gets them.
	scheme := runtime.NewScheme()
	var objs []runtime.Object
	for _, cd := range cds {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cd)
		if err != nil {
			return nil, err
		}
		obj := &unstructured.Unstructured{Object: u}
		obj.SetAPIVersion(gpuv1beta1.GroupVersion.String())
		obj.SetKind("ComputeDomain")
		objs = append(objs, obj)
	}
	gvr := gpuv1beta1.ComputeDomainResource
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{gvr: "ComputeDomainList"}, objs...)
	var mu sync.Mutex
	owned := map[string][]string{} // namespace/name/manager: entry names
	client.PrependReactor("patch", gvr.Resource, func(action k8stesting.Action) (bool, runtime.Object, error) {
		pa, ok := action.(k8stesting.PatchActionImpl)
		if !ok || pa.GetPatchType() != types.ApplyPatchType || pa.GetSubresource() != "status" {
			return false, nil, nil
		}
		var patch unstructured.Unstructured
		if err := json.Unmarshal(pa.GetPatch(), &patch.Object); err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		mu.Lock()
		defer mu.Unlock()
		cur, err := client.Tracker().Get(gvr, pa.GetNamespace(), pa.GetName())
		if err != nil {
			return true, nil, err
		}
		obj := cur.(*unstructured.Unstructured).DeepCopy()
		if uid := patch.GetUID(); uid != "" && uid != obj.GetUID() {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), pa.GetName(), fmt.Errorf("precondition failed: UID in object meta %s does not match UID %s", uid, obj.GetUID()))
		}
		applied, _, _ := unstructured.NestedSlice(patch.Object, "status", "nodes")
		var names []string
		for _, e := range applied {
			if m, ok := e.(map[string]any); ok {
				names = append(names, fmt.Sprint(m["name"]))
			}
		}
		key := pa.GetNamespace() + "/" + pa.GetName() + "/" + pa.GetPatchOptions().FieldManager
		mine := append(slices.Clone(owned[key]), names...)
		current, _, _ := unstructured.NestedSlice(obj.Object, "status", "nodes")
		nodes := slices.DeleteFunc(current, func(e any) bool {
			m, ok := e.(map[string]any)
			return ok && slices.Contains(mine, fmt.Sprint(m["name"]))
		})
		nodes = append(nodes, applied...)
		owned[key] = names
		if err := unstructured.SetNestedSlice(obj.Object, nodes, "status", "nodes"); err != nil {
			return true, nil, err
		}
		if err := client.Tracker().Update(gvr, obj, pa.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, obj, nil
	})
	return client, nil
}
