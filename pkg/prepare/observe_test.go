package prepare

import (
	"context"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry"
)

// The holders of a prepared device name the container of the pod that uses
// the claim, looked up after prepare, until the claim is unprepared.
func TestHoldersNameContainers(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "trainer-0", UID: "pod-uid"},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("c")}},
			Containers: []corev1.Container{
				{Name: "trainer", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}},
				{Name: "logger"},
			},
		},
	}
	d := newTestDriverWith(t, Options{Pods: fake.NewClientset(pod).CoreV1()})
	claim := allocated("c", []string{"gpu-0"})
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if err := prepareOne(t, d, claim); err != nil {
		t.Fatal(err)
	}
	uuid := d.PreparedClaims()[0].Devices[0].UUIDs[0]
	want := []telemetry.Holder{{Device: "gpu-0", Namespace: "ns", Claim: "c", Pod: "trainer-0", Container: "trainer"}}
	deadline := time.Now().Add(10 * time.Second)
	for got := d.Holders()[uuid]; !reflect.DeepEqual(got, want); got = d.Holders()[uuid] {
		if time.Now().After(deadline) {
			t.Fatalf("holders of %s = %+v, want %+v within 10s", uuid, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}

	res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: claim.UID}})
	if err != nil || res[claim.UID] != nil {
		t.Fatalf("unprepare: %v, %v", err, res[claim.UID])
	}
	if got := d.attribution.Consumers(claim.UID); got != nil {
		t.Errorf("consumers after unprepare: %+v", got)
	}
}
