package imexchannels

import (
	"cmp"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/internal/vaptest"
)

const controllerUser = "system:serviceaccount:gpu:rel-gpu-dra-driver-controller"

// TestControllerSlicePolicy evaluates the chart's policy on the
// controller's ResourceSlice writes: the channel slices this controller
// publishes are admitted (create, update, delete); every other slice, and
// turning a channel slice into another, is denied with the reason; other
// users are left to the other policies.
func TestControllerSlicePolicy(t *testing.T) {
	out, err := vaptest.Render(t, "../../../deployments/helm/gpu-dra-driver", "rel", "gpu", "templates/controller-admissionpolicy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	policy := vaptest.Compile(t, vaptest.Find(t, out, "-controller-resourceslices"))
	const clique = "5e1f0000-0000-0000-0000-00000000000a.1"
	client := newClient(node("tray-1", clique))
	start(t, client, 2)
	good := PublishedPools(t, client, map[string]int{clique: 2})[0]

	admit := func(op admission.Operation, obj, old *resourceapi.ResourceSlice, who string) (bool, string) {
		r := vaptest.Request{Operation: op, Name: good.Name, User: &user.DefaultInfo{Name: who},
			Kind: resourceapi.SchemeGroupVersion.WithKind("ResourceSlice"), Resource: resourceapi.SchemeGroupVersion.WithResource("resourceslices")}
		if obj != nil {
			r.Object = runtime.Object(obj)
		}
		if old != nil {
			r.OldObject = runtime.Object(old)
		}
		return policy.Admit(t, r)
	}
	for _, tc := range []struct {
		op       admission.Operation
		obj, old *resourceapi.ResourceSlice
	}{{admission.Create, good, nil}, {admission.Update, good, good}, {admission.Delete, nil, good}} {
		if matched, denied := admit(tc.op, tc.obj, tc.old, controllerUser); !matched || denied != "" {
			t.Errorf("%s of the controller's channel slice: matched %v, denied %q", tc.op, matched, denied)
		}
	}
	if matched, _ := admit(admission.Create, good, nil, "system:serviceaccount:gpu:rel-gpu-dra-driver-kubelet-plugin"); matched {
		t.Error("the policy matches another service account")
	}

	variants := map[string]func(*resourceapi.ResourceSlice){
		"a node's slice":        func(s *resourceapi.ResourceSlice) { s.Spec.NodeName, s.Spec.NodeSelector = ptr.To("tray-1"), nil },
		"nodeName and selector": func(s *resourceapi.ResourceSlice) { s.Spec.NodeName = ptr.To("tray-1") },
		"another pool":          func(s *resourceapi.ResourceSlice) { s.Spec.Pool.Name = "tray-1" },
		"the bare prefix":       func(s *resourceapi.ResourceSlice) { s.Spec.Pool.Name = "imex-channels." },
		"another driver":        func(s *resourceapi.ResourceSlice) { s.Spec.Driver = "gpu.example.com" },
		"all nodes":             func(s *resourceapi.ResourceSlice) { s.Spec.NodeSelector, s.Spec.AllNodes = nil, ptr.To(true) },
		"no node selection":     func(s *resourceapi.ResourceSlice) { s.Spec.NodeSelector = nil },
		"per-device node choice": func(s *resourceapi.ResourceSlice) {
			s.Spec.NodeSelector, s.Spec.PerDeviceNodeSelection = nil, ptr.To(true)
		},
	}
	for name, mutate := range variants {
		t.Run(name, func(t *testing.T) {
			bad := good.DeepCopy()
			mutate(bad)
			for _, tc := range []struct {
				op       admission.Operation
				obj, old *resourceapi.ResourceSlice
			}{
				{admission.Create, bad, nil},
				{admission.Update, bad, good}, // turning a channel slice into it
				{admission.Update, good, bad}, // taking it over
				{admission.Delete, nil, bad},
			} {
				_, denied := admit(tc.op, tc.obj, tc.old, controllerUser)
				if !strings.Contains(denied, "may only write the IMEX channel pools") {
					t.Errorf("%s: denied with %q, want the channel pools named", tc.op, denied)
				}
			}
		})
	}
}

// TestControllerSlicePolicyLeftovers: after a compat.nvidia switch the
// policy admits the controller's delete of a channel slice it published
// under the other known driver name, and nothing else of that name: no
// create or update, no slice another writer published, no other shape.
func TestControllerSlicePolicyLeftovers(t *testing.T) {
	const clique = "5e1f0000-0000-0000-0000-00000000000a.1"
	for _, tc := range []struct {
		name, driver, other string
		values              []string
	}{
		{name: "default", driver: driver, other: nvidia},
		{name: "compat.nvidia", driver: nvidia, other: driver, values: []string{"--set", "compat.nvidia=true"}},
		{name: "driver of its own", driver: "gpu.example.com", values: []string{"--set", "driverName=gpu.example.com"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := vaptest.Render(t, "../../../deployments/helm/gpu-dra-driver", "rel", "gpu", "templates/controller-admissionpolicy.yaml", tc.values...)
			if err != nil {
				t.Fatal(err)
			}
			policy := vaptest.Compile(t, vaptest.Find(t, out, "-controller-resourceslices"))
			admit := func(op admission.Operation, obj, old *resourceapi.ResourceSlice) string {
				r := vaptest.Request{Operation: op, User: &user.DefaultInfo{Name: controllerUser},
					Kind: resourceapi.SchemeGroupVersion.WithKind("ResourceSlice"), Resource: resourceapi.SchemeGroupVersion.WithResource("resourceslices")}
				if obj != nil {
					r.Object = obj
				}
				if old != nil {
					r.OldObject = old
				}
				_, denied := policy.Admit(t, r)
				return denied
			}
			// What the controller published before the switch, with the
			// field manager the API server records.
			previous := cmp.Or(tc.other, nvidia)
			client := newClient(node("tray-1", clique))
			stop := startDriver(t, client, previous, 2)
			leftover := publishedPools(t, client, previous, map[string]int{clique: 2})[0]
			stop()

			if denied := admit(admission.Delete, nil, leftover); (denied == "") != (tc.other != "") {
				t.Errorf("delete of the controller's channel slice of %s: denied %q", previous, denied)
			}
			if denied := admit(admission.Create, leftover, nil); denied == "" {
				t.Errorf("create of a channel slice of %s admitted", previous)
			}
			if denied := admit(admission.Update, leftover, leftover); denied == "" {
				t.Errorf("update of a channel slice of %s admitted", previous)
			}
			for name, mutate := range map[string]func(*resourceapi.ResourceSlice){
				"another writer's": func(s *resourceapi.ResourceSlice) {
					s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "gpu-kubelet-plugin", Operation: metav1.ManagedFieldsOperationUpdate}}
				},
				"no field managers": func(s *resourceapi.ResourceSlice) { s.ManagedFields = nil },
				"a node's":          func(s *resourceapi.ResourceSlice) { s.Spec.NodeName, s.Spec.NodeSelector = ptr.To("tray-1"), nil },
				"another pool":      func(s *resourceapi.ResourceSlice) { s.Spec.Pool.Name = "tray-1" },
				"a third driver's":  func(s *resourceapi.ResourceSlice) { s.Spec.Driver = "gpu.other.example.com" },
				"all nodes":         func(s *resourceapi.ResourceSlice) { s.Spec.NodeSelector, s.Spec.AllNodes = nil, ptr.To(true) },
				"no node selection": func(s *resourceapi.ResourceSlice) { s.Spec.NodeSelector = nil },
				"per-device choice": func(s *resourceapi.ResourceSlice) {
					s.Spec.NodeSelector, s.Spec.PerDeviceNodeSelection = nil, ptr.To(true)
				},
			} {
				bad := leftover.DeepCopy()
				mutate(bad)
				if denied := admit(admission.Delete, nil, bad); !strings.Contains(denied, "may only write the IMEX channel pools") {
					t.Errorf("delete of %s slice: denied %q, want the channel pools named", name, denied)
				}
			}
		})
	}
}
