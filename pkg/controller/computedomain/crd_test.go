package computedomain

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

func TestWaitForCRD(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := fake.NewClientset().Discovery().(*fakediscovery.FakeDiscovery)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if WaitForCRD(short, d, 10*time.Millisecond) {
		t.Fatal("served without the CRD")
	}
	d.Resources = []*metav1.APIResourceList{{
		GroupVersion: gpuv1beta1.GroupVersion.String(),
		APIResources: []metav1.APIResource{{Name: "computedomains"}},
	}}
	if !WaitForCRD(ctx, d, 10*time.Millisecond) {
		t.Fatal("not served with the CRD")
	}
}
