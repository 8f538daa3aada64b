package mpspod

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

// TestDaemonPodDrainable: with a budget, a daemon pod has what `kubectl
// drain --ignore-daemonsets --delete-emptydir-data` needs to take it
// without --force (k8s.io/kubectl/pkg/drain's filters): a controller, which
// is not a DaemonSet (the DaemonSet controller would delete or release the
// pod), and no emptyDir; the plugin's DaemonSet still owns it, for garbage
// collection. e2e TestDrain runs the real drain.
func TestDaemonPodDrainable(t *testing.T) {
	client := fake.NewClientset(&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "mps-daemons", UID: "pdb-uid"}})
	budget, err := BudgetOf(t.Context(), client, namespace, "mps-daemons")
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		budget         *metav1.OwnerReference
		wantController bool
	}{
		"with a budget": {budget: budget, wantController: true},
		"without":       {},
	} {
		t.Run(name, func(t *testing.T) {
			l, err := New(Options{Client: client, Namespace: namespace, NodeName: node, DriverName: "gpu.dra.dev", Image: "img", Owner: owner, Budget: tc.budget})
			if err != nil {
				t.Fatal(err)
			}
			pod := l.pod(sharing.Daemon{Name: "gpu-0", Binary: "/usr/bin/nvidia-cuda-mps-control", HostPipeDir: "/mps/gpu-0/pipe", PipeDir: "/mps/gpu-0/pipe", HostLogDir: "/mps/gpu-0/log", LogDir: "/mps/gpu-0/log", HostShmDir: "/mps/gpu-0/shm"})
			ctrl := metav1.GetControllerOf(pod)
			if got := ctrl != nil; got != tc.wantController {
				t.Fatalf("controller %v, want one: %v", ctrl, tc.wantController)
			}
			if ctrl != nil && (ctrl.Kind != "PodDisruptionBudget" || ctrl.UID != "pdb-uid" || ctrl.BlockOwnerDeletion == nil || *ctrl.BlockOwnerDeletion) {
				t.Errorf("controller %+v, want the budget, not blocking its deletion", ctrl)
			}
			if ctrl != nil && ctrl.Kind == appsv1.SchemeGroupVersion.WithKind("DaemonSet").Kind {
				t.Error("a DaemonSet controls the daemon pod")
			}
			owned := false
			for _, ref := range pod.OwnerReferences {
				owned = owned || ref.UID == owner.UID && (ref.Controller == nil || !*ref.Controller)
			}
			if !owned {
				t.Errorf("owners %+v: the plugin's DaemonSet %s is not a non-controller owner", pod.OwnerReferences, owner.Name)
			}
			for _, v := range pod.Spec.Volumes {
				if v.EmptyDir != nil || v.VolumeSource == (corev1.VolumeSource{}) {
					t.Errorf("volume %s is not a host path: drain needs --delete-emptydir-data for it", v.Name)
				}
			}
		})
	}
	if _, err := BudgetOf(t.Context(), client, namespace, "other"); err == nil || !strings.Contains(err.Error(), namespace+"/other") {
		t.Errorf("BudgetOf of a missing budget: %v, want an error naming it", err)
	}
}
