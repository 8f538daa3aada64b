package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
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
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// TestStaleClaimsReleased is issue #13's reproduction: with the kubelet
// stopped, pods holding a whole GPU, a MIG device and an MPS share are
// force-deleted with their claims and the kubelet's DRA state is removed,
// so the restarted kubelet never unprepares the claims. The plugin releases
// them within its grace period (kubeletPlugin.staleClaimGracePeriod, short
// in make e2e): the CDI specs, the MIG instance and the MPS daemon go, the
// Node gets an event per claim, and new pods get those GPUs and run.
func TestStaleClaimsReleased(t *testing.T) {
	ctx := testContext(t)
	grace := staleClaimGracePeriod(t, ctx)
	ns := newNamespace(t, ctx, "stale")
	classes := map[string]resourceapi.ExactDeviceRequest{
		"g": {DeviceClassName: driverName},
		"m": {DeviceClassName: "mig." + driverName, Selectors: celSelector(`device.attributes["gpu.dra.dev"].profile == "1g.10gb"`)},
		"s": {DeviceClassName: "mps." + driverName},
	}
	before := migUUIDs(t)
	claims := map[string]*resourceapi.ResourceClaim{}
	gpus := map[string]bool{} // UUIDs of the GPUs the claims hold
	for name, req := range classes {
		standaloneClaim(t, ctx, ns, name, req)
		claimNamePod(t, ctx, ns, name, name)
		claims[name] = waitAllocated(t, ctx, ns, name)
		gpus[claimGPU(t, ctx, claims[name])] = true
		if !fileExists(cdiSpecPath(claims[name])) {
			t.Fatalf("claim %s prepared without the CDI spec %s", name, cdiSpecPath(claims[name]))
		}
	}
	var migs []string // the MIG claim's instance
	for uuid := range migUUIDs(t) {
		if _, ok := before[uuid]; !ok {
			migs = append(migs, uuid)
		}
	}
	if len(migs) != 1 {
		t.Fatalf("MIG instances created for the MIG claim: %v, want one", migs)
	}
	mpsUUID := claimGPU(t, ctx, claims["s"])
	if len(mpsDaemonPods(t, ctx, mpsUUID)) != 1 {
		t.Fatalf("no MPS control daemon pod for the MPS share on %s", mpsUUID)
	}

	k := stopKubelet(t, ctx)
	c := env.cluster.Client
	for name := range claims {
		if err := c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatalf("force-delete pod %s: %v", name, err)
		}
		if err := c.ResourceV1().ResourceClaims(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatalf("delete claim %s: %v", name, err)
		}
	}
	waitClaimsGone(t, ctx, ns, slices.Collect(maps.Keys(claims)))
	state := filepath.Join(env.kubeletDir, "dra_manager_state")
	if err := os.Remove(state); err != nil {
		t.Fatalf("remove the kubelet's DRA state: %v", err)
	}
	k.start(t, ctx)

	// New pods get the same GPUs at once: whole GPUs, which conflict
	// with any claim left prepared on them, so they wait for the release.
	var newPods []string
	for uuid := range gpus {
		name := fmt.Sprintf("new-%d", len(newPods))
		newPods = append(newPods, name)
		standaloneClaim(t, ctx, ns, name, resourceapi.ExactDeviceRequest{DeviceClassName: driverName,
			Selectors: celSelector(fmt.Sprintf(`device.attributes["gpu.dra.dev"].uuid == %q`, uuid))})
		claimNamePod(t, ctx, ns, name, name)
	}
	for name, claim := range claims {
		waitGone(t, ctx, cdiSpecPath(claim), "CDI spec of stale claim "+name)
	}
	released := time.Since(k.startedAt)
	t.Logf("stale claims released %s after the kubelet's restart (grace period %s)", released.Round(time.Second), grace)
	// The grace period counts from when the plugin first saw the claims
	// gone, before the restart; one check period (grace/4) comes on top.
	if limit := grace + grace/4 + 15*time.Second; released > limit {
		t.Errorf("the stale claims were released %s after the kubelet's restart, want within %s", released, limit)
	}
	// The kubelet retries a pod whose prepare failed at its next resync
	// (1 to 1.5 min), not sooner.
	for _, name := range newPods {
		if err := env.runner.WaitPodRunning(ctx, ns, name); err != nil {
			evs, _ := env.runner.PodEvents(ctx, ns, name)
			t.Fatalf("new pod %s on a stale claim's GPU: %v; events: %s", name, err, strings.Join(evs, "; "))
		}
	}
	t.Logf("new pods ran on the stale claims' GPUs %s after the kubelet's restart", time.Since(k.startedAt).Round(time.Second))
	for _, uuid := range migs {
		if _, ok := migUUIDs(t)[uuid]; ok {
			t.Errorf("MIG instance %s of the stale claim still exists", uuid)
		}
	}
	if err := poll(ctx, func(ctx context.Context) (bool, error) { return len(mpsDaemonPods(t, ctx, mpsUUID)) == 0, nil }); err != nil {
		t.Errorf("the stale MPS share's daemon pod is left: %v", podNames(mpsDaemonPods(t, ctx, mpsUUID)))
	}
	evs, err := c.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + staleclaims.EventReason})
	if err != nil {
		t.Fatal(err)
	}
	for name, claim := range claims {
		found := false
		for _, ev := range evs.Items {
			found = found || ev.InvolvedObject.Kind == "Node" && ev.InvolvedObject.Name == env.node && strings.Contains(ev.Message, string(claim.UID))
		}
		if !found {
			t.Errorf("no %s event on node %s for claim %s (%s)", staleclaims.EventReason, env.node, name, claim.UID)
		}
	}
}

// staleClaimGracePeriod is the plugin's --stale-claim-grace-period; the
// test skips when releasing is off.
func staleClaimGracePeriod(t *testing.T, ctx context.Context) time.Duration {
	t.Helper()
	pod := pluginPod(t, ctx)
	for _, c := range pod.Spec.Containers {
		for _, arg := range c.Args {
			if v, ok := strings.CutPrefix(arg, "--stale-claim-grace-period="); ok {
				d, err := time.ParseDuration(v)
				if err != nil {
					t.Fatalf("plugin argument %s: %v", arg, err)
				}
				if d == 0 {
					t.Skip("the plugin releases no stale claims (kubeletPlugin.staleClaimGracePeriod: 0)")
				}
				if d > 2*time.Minute {
					t.Skipf("kubeletPlugin.staleClaimGracePeriod %s is too long for this test (make e2e sets 30s)", d)
				}
				return d
			}
		}
	}
	t.Skip("the plugin has no --stale-claim-grace-period (chart without stale claim release)")
	return 0
}

// standaloneClaim creates a ResourceClaim with one request.
func standaloneClaim(t *testing.T, ctx context.Context, ns, name string, req resourceapi.ExactDeviceRequest) {
	t.Helper()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "dev", Exactly: &req}}}},
	}
	if _, err := env.cluster.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create claim %s/%s: %v", ns, name, err)
	}
}

// claimNamePod creates a pod using the named claim and waits until it runs.
func claimNamePod(t *testing.T, ctx context.Context, ns, name, claim string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       sleeperSpec(corev1.PodResourceClaim{Name: "dev", ResourceClaimName: &claim}),
	}
	if _, err := env.cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
}

// waitAllocated waits until the claim's pod runs and returns the claim.
func waitAllocated(t *testing.T, ctx context.Context, ns, name string) *resourceapi.ResourceClaim {
	t.Helper()
	if err := env.runner.WaitPodRunning(ctx, ns, name); err != nil {
		evs, _ := env.runner.PodEvents(ctx, ns, name)
		t.Fatalf("%v; events: %s", err, strings.Join(evs, "; "))
	}
	claim, err := env.cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s/%s of a running pod: allocation %+v, want one device", ns, name, claim.Status.Allocation)
	}
	return claim
}

// waitClaimsGone waits until the claims are deleted. With the kubelet
// stopped, the ResourceClaim controller drops the force-deleted pods from
// the claims' reservations, deallocates them and lets them go; should it
// not within 20 s, the test removes their finalizers, as an operator
// force-deleting them would (the node goes NotReady after 50 s).
func waitClaimsGone(t *testing.T, ctx context.Context, ns string, names []string) {
	t.Helper()
	c := env.cluster.Client.ResourceV1().ResourceClaims(ns)
	gone := func(name string) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			_, err := c.Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, name := range names {
		if poll(wctx, gone(name)) == nil {
			continue
		}
		t.Logf("claim %s/%s still there 20 s after its deletion: removing its finalizers", ns, name)
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": nil}})
		if _, err := c.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("remove the finalizers of claim %s/%s: %v", ns, name, err)
		}
		if err := poll(ctx, gone(name)); err != nil {
			t.Fatalf("claim %s/%s not deleted: %v", ns, name, err)
		}
	}
}

// claimGPU is the UUID of the GPU the claim's device is, or is carved from.
func claimGPU(t *testing.T, ctx context.Context, claim *resourceapi.ResourceClaim) string {
	t.Helper()
	r := claim.Status.Allocation.Devices.Results[0]
	for _, s := range nodeSlices(t, ctx, env.node) {
		if s.Spec.Pool.Name != r.Pool {
			continue
		}
		for _, d := range s.Spec.Devices {
			if d.Name != r.Device {
				continue
			}
			for _, attr := range []resourceapi.QualifiedName{vocabulary.AttrParentUUID, vocabulary.AttrUUID} {
				if v := d.Attributes[attr].StringValue; v != nil {
					return *v
				}
			}
		}
	}
	t.Fatalf("device %s of claim %s has no GPU UUID in the node's ResourceSlices", r.Device, claim.Name)
	return ""
}

func podNames(pods []corev1.Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return names
}
