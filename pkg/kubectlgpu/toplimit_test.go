package kubectlgpu

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry"
)

// The limit the plugin reports for a share (an MPS share's pinned limit of
// 8Gi) wins over the claim's consumed capacity (20Gi); a share the plugin
// reports no limit for keeps the claim's capacity.
func TestTopReportedLimit(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-a")
	uuid := node.GPUs[0].UUID
	holders := telemetry.HolderFunc(func() map[string][]telemetry.Holder {
		return map[string][]telemetry.Holder{uuid: {
			{Device: "gpu-0-mps", Namespace: "ns", Claim: "pinned", Pod: "a", Container: "main", MemoryLimitBytes: 8 << 30},
			{Device: "gpu-0-mps", Namespace: "ns", Claim: "unreported", Pod: "b", Container: "main"},
		}}
	})
	c := telemetry.NewCollector(telemetry.CollectorOptions{NVML: node.Machine, NodeName: "node-a", GPUs: node.GPUs, Holders: holders})
	reader := handlerReader{"node-a": telemetry.Handler(telemetry.NewRegistry(nil, c))}
	claim := func(name string) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "share", Driver: "gpu.dra.dev", Pool: "node-a", Device: "gpu-0-mps",
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("20Gi")},
		}}}}
		return c
	}
	client := fake.NewClientset(pluginPod("plugin-a", "node-a", "--local-metrics-address=127.0.0.1:9401"), claim("pinned"), claim("unreported"))
	list, warnings, err := Top(context.Background(), client, TopOptions{Namespace: "ns", Reader: reader})
	if err != nil || len(warnings) != 0 {
		t.Fatalf("Top = %v, warnings %q", err, warnings)
	}
	want := map[string]int64{"pinned": 8 << 30, "unreported": 20 << 30}
	if len(list.Items) != len(want) {
		t.Fatalf("rows %+v, want one per claim", list.Items)
	}
	for _, r := range list.Items {
		if r.MemoryLimitBytes != want[r.Claim] {
			t.Errorf("claim %s: limit %d, want %d", r.Claim, r.MemoryLimitBytes, want[r.Claim])
		}
	}
}
