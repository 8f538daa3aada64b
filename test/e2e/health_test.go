package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
)

// TestHealthXID79: a simulated XID 79 on the GPU of a running pod taints every
// device of that GPU in the ResourceSlice (NoExecute) within seconds, keeps a new
// claim off the GPU, shows in the pod's allocatedResourcesStatus and in kubectl gpu
// nodes, and goes away after the recovery window, after which the new claim gets
// the GPU.
func TestHealthXID79(t *testing.T) {
	ctx := testContext(t)
	r := env.runner
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := r.CleanupHealth(ctx); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	var log strings.Builder
	h, err := r.Health(ctx, env.node, 79, env.recoveryWindow+time.Minute, &log)
	t.Log("\n" + log.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range h.Problems() {
		t.Error(p)
	}
	if h.TaintAfter > 5*time.Second {
		t.Errorf("the taint appeared %s after the event, want within 5s", h.TaintAfter)
	}
	want := fmt.Sprintf("%s: %s=XID79:NoExecute", h.GPU, scenarios.HealthTaintKey)
	if len(h.Taints) == 0 || !contains(h.Taints, want) {
		t.Errorf("taints %v, want %q", h.Taints, want)
	}
	if !contains(h.Taints, fmt.Sprintf("%s: %s=XID79:NoExecute", h.Share, scenarios.HealthTaintKey)) {
		t.Errorf("the victim's share %s is not tainted: %v", h.Share, h.Taints)
	}
	if h.RecoveredAfter < env.recoveryWindow {
		t.Errorf("recovered after %s, before the recovery window %s", h.RecoveredAfter, env.recoveryWindow)
	}
	found := false
	for _, l := range h.PodStatus {
		found = found || strings.Contains(l, h.Share) && strings.Contains(l, "Unhealthy")
	}
	if !found {
		t.Errorf("the victim's allocatedResourcesStatus does not say %s is Unhealthy: %v", h.Share, h.PodStatus)
	}
	if r.KubectlGPUPath != "" && !strings.Contains(h.NodesWhileTainted, scenarios.HealthTaintKey+"=XID79:NoExecute") {
		t.Errorf("kubectl gpu nodes shows no XID79 taint while the GPU was tainted:\n%s", h.NodesWhileTainted)
	}
	// After recovery, kubectl gpu shows no taint.
	if r.KubectlGPUPath != "" {
		var nodes kubectlgpu.NodeList
		if err := r.KubectlGPUJSON(ctx, &nodes, "nodes"); err != nil {
			t.Fatal(err)
		}
		if nodes.Total.Tainted != 0 {
			t.Errorf("kubectl gpu nodes: %d tainted GPUs after recovery", nodes.Total.Tainted)
		}
	}
}

func contains(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}
