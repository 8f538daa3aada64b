package imexchannels

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
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
