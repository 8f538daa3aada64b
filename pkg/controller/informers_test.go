package controller

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// TestControllersShareOneSliceInformer runs every leader-only controller
// and checks that the process lists the driver's ResourceSlices once: the
// controllers share one cache of the largest objects they read (the nodes'
// slices).
func TestControllersShareOneSliceInformer(t *testing.T) {
	const ns, nodeName = "gpu-dra", "node-a"
	lapsed := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: vocabulary.HeartbeatLeaseName(nodeName), Namespace: ns,
			Labels: map[string]string{vocabulary.LabelHeartbeat: "true"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("plugin"), RenewTime: ptr.To(metav1.NewMicroTime(time.Now()))},
	}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, lapsed)
	client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
		GroupVersion: resourceapi.SchemeGroupVersion.String(),
		APIResources: []metav1.APIResource{{Name: "resourceslices"}, {Name: "devicetaintrules"}},
	}}
	ctx := context.Background()
	for i, s := range simnode.New(t, "l4x4", nodeName).Slices(vocabulary.DriverName) {
		s.Name = nodeName + "-" + string(rune('a'+i))
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := defaults(t, "--namespace="+ns, "--webhook=false", "--leader-elect=false",
		"--node-labels", "--model-device-classes", "--mig-profile-device-classes", "--outage-taints", "--outage-grace-period=1s")
	cfg.KubeClient = client
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	start(t, cfg)

	// The outage controller taints only once all its caches, the slices'
	// too, have synced: then every controller has listed what it reads.
	poll(t, "outage taint", func() bool {
		_, err := client.ResourceV1().DeviceTaintRules().Get(ctx, vocabulary.OutageRuleName(nodeName), metav1.GetOptions{})
		return err == nil
	})
	poll(t, "model class", func() bool {
		_, err := client.ResourceV1().DeviceClasses().Get(ctx, "nvidia-l4.gpu.dra.dev", metav1.GetOptions{})
		return err == nil
	})
	lists := 0
	for _, a := range client.Actions() {
		if a.GetVerb() != "list" || a.GetResource().Resource != "resourceslices" {
			continue
		}
		// The IMEX channel publisher (the upstream resourceslice
		// controller) keeps its own cache of the slices without a node,
		// its channel pools: none of the nodes' slices.
		if nodeName, ok := a.(k8stesting.ListAction).GetListRestrictions().Fields.RequiresExactMatch(resourceapi.ResourceSliceSelectorNodeName); ok && nodeName == "" {
			continue
		}
		lists++
	}
	if lists != 1 {
		t.Errorf("the controllers listed ResourceSlices %d times, want once (one shared informer)", lists)
	}
}
