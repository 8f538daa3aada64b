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
// nodes. The simulated hardware reports that XID 79 needs a node reboot, so the
// taint (XID79-reboot-required) stays past the recovery window, and goes away once
// the simulated node has rebooted (a new boot ID), after which the new claim gets
// the GPU.
func TestHealthXID79(t *testing.T) {
	h, r := runHealth(t, 79)
	for _, p := range h.Problems() {
		t.Error(p)
	}
	if h.TaintAfter > 5*time.Second {
		t.Errorf("the taint appeared %s after the event, want within 5s", h.TaintAfter)
	}
	want := fmt.Sprintf("%s: %s=XID79-reboot-required:NoExecute", h.Share, scenarios.HealthTaintKey)
	if len(h.Taints) == 0 || !contains(h.Taints, want) {
		t.Errorf("taints %v, want %q", h.Taints, want)
	}
	if !contains(h.Taints, fmt.Sprintf("%s: %s=XID79-reboot-required:NoExecute", h.Share, scenarios.HealthTaintKey)) {
		t.Errorf("the victim's share %s is not tainted: %v", h.Share, h.Taints)
	}
	if h.RecoveredAfter < env.recoveryWindow {
		t.Errorf("recovered after %s, before the recovery window %s", h.RecoveredAfter, env.recoveryWindow)
	}
	if h.Action != "reboot" || !h.StillTaintedPastWindow || h.Performed != "reboot=true" {
		t.Errorf("recovery action %q, still tainted past the window %v, performed %q; want reboot, true, reboot=true",
			h.Action, h.StillTaintedPastWindow, h.Performed)
	}
	found := false
	for _, l := range h.PodStatus {
		found = found || strings.Contains(l, h.Share) && strings.Contains(l, "Unhealthy")
	}
	if !found {
		t.Errorf("the victim's allocatedResourcesStatus does not say %s is Unhealthy: %v", h.Share, h.PodStatus)
	}
	if r.KubectlGPUPath != "" && !strings.Contains(h.NodesWhileTainted, scenarios.HealthTaintKey+"=XID79-reboot-required:NoExecute") {
		t.Errorf("kubectl gpu nodes shows no XID79 taint while the GPU was tainted:\n%s", h.NodesWhileTainted)
	}
	// After recovery, kubectl gpu shows no taint.
	if r.KubectlGPUPath != "" {
		var nodes kubectlgpu.NodeList
		if err := r.KubectlGPUJSON(testContext(t), &nodes, "nodes"); err != nil {
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

// TestHealthXID48ResetRequired: the simulated hardware reports that XID 48 (a
// double-bit ECC error) needs a GPU reset, so the GPU's taint names it
// (XID48-reset-required, NoSchedule), stays past the recovery window, and goes
// away once the simulated GPU has been reset, after which the new claim gets the
// GPU. NoSchedule evicts nobody, so the eviction checks of Problems do not apply.
func TestHealthXID48ResetRequired(t *testing.T) {
	h, r := runHealth(t, 48)
	want := fmt.Sprintf("%s: %s=XID48-reset-required:NoSchedule", h.Share, scenarios.HealthTaintKey)
	if !contains(h.Taints, want) {
		t.Errorf("taints %v, want %q", h.Taints, want)
	}
	if h.Action != "reset" || !h.StillTaintedPastWindow || !strings.Contains(h.Performed, "reset=true") {
		t.Errorf("recovery action %q, still tainted past the window %v, performed %q; want reset, true, reset=true",
			h.Action, h.StillTaintedPastWindow, h.Performed)
	}
	if !h.ProbePending || !h.ProbeRanAfterRecovery {
		t.Errorf("probe pending while tainted %v, ran after the reset %v; want both", h.ProbePending, h.ProbeRanAfterRecovery)
	}
	if r.KubectlGPUPath != "" && !strings.Contains(h.NodesWhileTainted, scenarios.HealthTaintKey+"=XID48-reset-required:NoSchedule") {
		t.Errorf("kubectl gpu nodes does not name the pending reset:\n%s", h.NodesWhileTainted)
	}
}

// runHealth runs the health scenario with XID xid on the test node, logs what it
// printed, and deletes its namespace at the end of the test.
func runHealth(t *testing.T, xid int) (*scenarios.HealthResult, *scenarios.Runner) {
	t.Helper()
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
	h, err := r.Health(ctx, env.node, xid, env.recoveryWindow+time.Minute, &log)
	t.Log("\n" + log.String())
	if err != nil {
		t.Fatal(err)
	}
	return h, r
}
