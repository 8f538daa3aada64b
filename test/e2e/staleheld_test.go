package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/staleclaims"
)

// TestStaleClaimHeldUnderRunningPod is issue #22's first item on the real
// kubelet: a tenant removes the delete-protection finalizer from its claim
// and deletes it while its pod runs. The scheduler then gives the GPU to a
// second pod (pinned to its UUID), but past the plugin's grace period the
// first claim is still prepared (its CDI spec stays, the Node gets a
// StaleClaimHeld event, no StaleClaimReleased one) and the second pod does
// not run. Once the first pod is deleted, the GPU goes to the second.
func TestStaleClaimHeldUnderRunningPod(t *testing.T) {
	ctx := testContext(t)
	grace := staleClaimGracePeriod(t, ctx)
	ns := newNamespace(t, ctx, "stale-held")
	c := env.cluster.Client
	standaloneClaim(t, ctx, ns, "tenant", resourceapi.ExactDeviceRequest{DeviceClassName: driverName})
	claimNamePod(t, ctx, ns, "tenant", "tenant")
	claim := waitAllocated(t, ctx, ns, "tenant")
	uuid := claimGPU(t, ctx, claim)

	// What a tenant may do to its own claim under a running pod.
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": nil}})
	if _, err := c.ResourceV1().ResourceClaims(ns).Patch(ctx, "tenant", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("remove the finalizers of claim tenant: %v", err)
	}
	if err := c.ResourceV1().ResourceClaims(ns).Delete(ctx, "tenant", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete claim tenant: %v", err)
	}
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, "tenant", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("claim tenant not deleted: %v", err)
	}
	deleted := time.Now()

	standaloneClaim(t, ctx, ns, "second", resourceapi.ExactDeviceRequest{DeviceClassName: driverName,
		Selectors: celSelector(fmt.Sprintf(`device.attributes["gpu.dra.dev"].uuid == %q`, uuid))})
	claimNamePod(t, ctx, ns, "second", "second")

	// One check period (grace/4) and a margin past the grace period.
	wait := grace + grace/4 + 15*time.Second
	held := false
	for time.Since(deleted) < wait {
		held = held || len(nodeEvents(t, ctx, staleclaims.HeldEventReason, claim.UID)) > 0
		if released := nodeEvents(t, ctx, staleclaims.EventReason, claim.UID); len(released) > 0 {
			t.Fatalf("claim released while its pod runs: %q", released)
		}
		if pod, err := c.CoreV1().Pods(ns).Get(ctx, "second", metav1.GetOptions{}); err == nil && pod.Status.Phase == corev1.PodRunning {
			t.Fatalf("pod second runs on GPU %s while pod tenant still has it", uuid)
		}
		time.Sleep(2 * time.Second)
	}
	if !held {
		t.Errorf("no %s event on node %s for claim %s after %s", staleclaims.HeldEventReason, env.node, claim.UID, wait)
	}
	if !fileExists(cdiSpecPath(claim)) {
		t.Errorf("the CDI spec of the claim under the running pod is gone")
	}

	if err := c.CoreV1().Pods(ns).Delete(ctx, "tenant", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}); err != nil {
		t.Fatalf("delete pod tenant: %v", err)
	}
	waitGone(t, ctx, cdiSpecPath(claim), "CDI spec of the ended pod's claim")
	// The kubelet retries the second pod's prepare at its next resync.
	if err := env.runner.WaitPodRunning(ctx, ns, "second"); err != nil {
		evs, _ := env.runner.PodEvents(ctx, ns, "second")
		t.Fatalf("pod second once pod tenant ended: %v; events: %s", err, strings.Join(evs, "; "))
	}
}

// nodeEvents are the messages of the node's events of reason that name
// claim uid.
func nodeEvents(t *testing.T, ctx context.Context, reason string, uid types.UID) []string {
	t.Helper()
	evs, err := env.cluster.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs.Items {
		if ev.InvolvedObject.Kind == "Node" && ev.InvolvedObject.Name == env.node && strings.Contains(ev.Message, string(uid)) {
			out = append(out, ev.Message)
		}
	}
	return out
}
