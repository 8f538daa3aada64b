package mpspod

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

// A device's earlier daemon pod that is still terminating (deleted, its
// container exited 0, the kubelet not yet done with it) is not the daemon a
// new Acquire waits for, wherever the API server lists it. The rolling
// upgrade e2e failed an MPS prepare with "pod … is Succeeded, container
// exited with 0" when the old pod sorted after the new one.
func TestTerminatingDaemonPodIsNotTheNewOne(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	r := newRig(t)
	const oldSuffix = "zzzzz" // sorts after every generated name
	first := true
	r.client.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if pod := action.(k8stesting.CreateAction).GetObject().(*corev1.Pod); first && pod.Name == "" {
			first = false
			pod.Name = pod.GenerateName + oldSuffix
		}
		return false, nil, nil
	})
	// The kubelet never finishes deleting the old pod: it stays terminating,
	// Succeeded, as a slow kubelet leaves it.
	r.client.PrependReactor("delete", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		name := action.(k8stesting.DeleteAction).GetName()
		if !strings.HasSuffix(name, oldSuffix) {
			return false, nil, nil
		}
		obj, err := r.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), namespace, name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		now := metav1.Now()
		pod.DeletionTimestamp = &now
		pod.Status.Phase = corev1.PodSucceeded
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "mps-control",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}}}
		return true, pod, r.client.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), pod, namespace)
	})
	m := r.manager()
	if _, err := m.Acquire(ctx, r.gpu, sharing.MPSShare{ID: "claim-a"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Release(ctx, r.gpu, "claim-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Acquire(ctx, r.gpu, sharing.MPSShare{ID: "claim-b"}); err != nil {
		t.Fatalf("Acquire after the old daemon pod's deletion: %v", err)
	}
}
