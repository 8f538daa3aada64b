package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/modelclasses"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
)

// The fleet tests run on every node of the local cluster (make e2e: two
// simulated DGX H100 nodes and one L4 node, hack/demo/lib.sh; the GB200 trays
// are left to the compute-domain tests).

// productNodes maps each GPU product to the nodes that have it.
func productNodes(t *testing.T, ctx context.Context, nodes []string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, n := range nodes {
		p := product(t, nodeSlices(t, ctx, n))
		out[p] = append(out[p], n)
	}
	return out
}

// onNodes pins a pod to the given nodes by hostname affinity.
func onNodes(pod *corev1.Pod, nodes ...string) *corev1.Pod {
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: nodes}},
		}}},
	}}
	return pod
}

// createPod creates pod without waiting.
func createPod(t *testing.T, ctx context.Context, pod *corev1.Pod) {
	t.Helper()
	if _, err := env.cluster.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
}

// runningPod waits until the pod runs and returns it.
func runningPod(t *testing.T, ctx context.Context, ns, name string) *corev1.Pod {
	t.Helper()
	if err := env.runner.WaitPodRunning(ctx, ns, name); err != nil {
		evs, _ := env.runner.PodEvents(ctx, ns, name)
		t.Fatalf("%v; events: %s", err, strings.Join(evs, "; "))
	}
	p, err := env.cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitUnschedulable waits until the scheduler reports the pod Unschedulable and
// returns its message.
func waitUnschedulable(t *testing.T, ctx context.Context, ns, name string) string {
	t.Helper()
	msg := ""
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		p, err := env.cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("pod %s/%s was bound to %s, want Pending", ns, name, p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				msg = c.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s never reported Unschedulable: %v", ns, name, err)
	}
	return msg
}

// TestFleetMixedModels: on a fleet of two models, each model's DeviceClass
// and a CEL selector on productName land pods on that model's nodes; every
// node has its GFD label and a line in kubectl gpu nodes; a claim no node can
// satisfy stays Pending with the scheduler's reason.
func TestFleetMixedModels(t *testing.T) {
	ctx := testContext(t)
	nodes := useFleet(t, 2)
	models := productNodes(t, ctx, nodes)
	if len(models) < 2 {
		t.Skipf("needs nodes of two GPU models, have %v (make e2e simulates an L4 node: DEMO_NODE_MACHINES)", models)
	}
	// Turning the option off leaves the classes: remove them once the release
	// is restored (cleanups run last in, first out).
	t.Cleanup(func() {
		err := env.cluster.Client.ResourceV1().DeviceClasses().DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: modelclasses.ModelClassLabel(driverName) + "=true"})
		if err != nil {
			t.Errorf("delete the per-model classes: %v", err)
		}
	})
	saveRelease(t, ctx)
	upgradeRelease(t, ctx, "--set", "controller.modelDeviceClasses=true")
	ns := newNamespace(t, ctx, "e2e-fleet-models")

	for p, want := range models {
		class := waitModelClass(t, ctx, p)
		for how, req := range map[string]resourceapi.ExactDeviceRequest{
			"class":    {DeviceClassName: class.Name},
			"selector": {DeviceClassName: driverName, Selectors: celSelector(`device.attributes["gpu.dra.dev"].productName == "` + p + `"`)},
		} {
			name := how + "-" + strings.Trim(strings.ToLower(strings.NewReplacer(" ", "-", ".", "-").Replace(p)), "-")
			if len(name) > 50 {
				name = name[:50]
			}
			name = strings.TrimRight(name, "-")
			claimTemplate(t, ctx, ns, name, req)
			pod := claimPod(t, ctx, ns, name, name)
			if !slices.Contains(want, pod.Spec.NodeName) {
				t.Errorf("pod %s for %s (%s) runs on %s, want one of %v", name, p, how, pod.Spec.NodeName, want)
			} else {
				t.Logf("%s (%s): pod on %s", p, how, pod.Spec.NodeName)
			}
		}
		// GFD's label, as dra-controller keeps it.
		for _, n := range want {
			node, err := env.cluster.Client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got, wantLabel := node.Labels["nvidia.com/gpu.product"], strings.ReplaceAll(p, " ", "-"); got != wantLabel {
				t.Errorf("node %s: nvidia.com/gpu.product=%q, want %q", n, got, wantLabel)
			}
		}
	}

	out, err := env.runner.KubectlGPU(ctx, "nodes")
	if err != nil {
		t.Fatalf("kubectl gpu nodes: %v", err)
	}
	for p, ns := range models {
		for _, n := range ns {
			line := ""
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, n+" ") {
					line = l
				}
			}
			if !strings.Contains(line, p) {
				t.Errorf("kubectl gpu nodes: no line for %s with %s:\n%s", n, p, out)
			}
		}
	}

	// More GPUs of a model in one claim than any node of it has.
	smallest, most := "", 0
	for p, ns := range models {
		if n := len(nodeDevicesOfType(t, ctx, ns[0], "gpu")); smallest == "" || n < most {
			smallest, most = p, n
		}
	}
	claimTemplate(t, ctx, ns, "too-many", resourceapi.ExactDeviceRequest{DeviceClassName: driverName,
		AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(most + 1),
		Selectors: celSelector(`device.attributes["gpu.dra.dev"].productName == "` + smallest + `"`)})
	createPod(t, ctx, newClaimPod(ns, "too-many", "too-many"))
	msg := waitUnschedulable(t, ctx, ns, "too-many")
	t.Logf("%d× %s in one claim: Pending: %s", most+1, smallest, msg)
	if !strings.Contains(msg, "cannot allocate all claims") {
		t.Errorf("the scheduler's reason does not say the claim cannot be allocated: %q", msg)
	}
}

// nodeDevicesOfType lists the names of node's published devices of a type
// attribute (gpu, mig, ...).
func nodeDevicesOfType(t *testing.T, ctx context.Context, node, typ string) []string {
	t.Helper()
	var out []string
	for _, s := range nodeSlices(t, ctx, node) {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes["type"]; ok && a.StringValue != nil && *a.StringValue == typ {
				out = append(out, d.Name)
			}
		}
	}
	return out
}

// TestFleetGang: a PodGroup of two pods of 8 GPUs each, more than any node
// has: with one GPU of the second node taken none starts and no claim is
// allocated; once it is free both start together, one per node.
func TestFleetGang(t *testing.T) {
	ctx := testContext(t)
	nodes := useFleet(t, 2)
	var big []string
	for p, ns := range productNodes(t, ctx, nodes) {
		if len(ns) >= 2 && len(big) == 0 {
			big = ns[:2]
			t.Logf("gang over %v (%s)", big, p)
		}
	}
	if big == nil {
		t.Skip("needs two nodes of one GPU model")
	}
	per := len(nodeDevicesOfType(t, ctx, big[0], "gpu"))
	ns := newNamespace(t, ctx, "e2e-fleet-gang")
	claimTemplate(t, ctx, ns, "one", resourceapi.ExactDeviceRequest{DeviceClassName: driverName})
	claimTemplate(t, ctx, ns, "all", resourceapi.ExactDeviceRequest{DeviceClassName: driverName,
		AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(per)})

	// One GPU of the second node is taken: the cluster has 2×per-1 free on these nodes.
	createPod(t, ctx, onNodes(newClaimPod(ns, "blocker", "one"), big[1]))
	runningPod(t, ctx, ns, "blocker")
	if _, err := env.cluster.Client.SchedulingV1beta1().PodGroups(ns).Create(ctx, &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "gang", Namespace: ns},
		Spec: schedulingv1beta1.PodGroupSpec{SchedulingPolicy: schedulingv1beta1.PodGroupSchedulingPolicy{
			Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PodGroup: %v", err)
	}
	workers := []string{"worker-0", "worker-1"}
	for _, w := range workers {
		pod := onNodes(newClaimPod(ns, w, "all"), big...)
		pod.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("gang")}
		createPod(t, ctx, pod)
	}
	// None starts, none holds a GPU, for a while.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, w := range workers {
			p, err := env.cluster.Client.CoreV1().Pods(ns).Get(ctx, w, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Spec.NodeName != "" {
				t.Fatalf("%s bound to %s while the gang cannot fit", w, p.Spec.NodeName)
			}
		}
		claims, err := env.cluster.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range claims.Items {
			if c.Status.Allocation != nil && !strings.HasPrefix(c.Name, "blocker") {
				t.Fatalf("claim %s allocated while its gang cannot fit: %+v", c.Name, c.Status.Allocation.Devices.Results)
			}
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("gang of 2×%d GPUs: all Pending, no claim allocated, with %d free", per, 2*per-1)

	deletePod(t, ctx, ns, "blocker")
	var started []time.Time
	seen := map[string]bool{}
	for _, w := range workers {
		p := runningPod(t, ctx, ns, w)
		seen[p.Spec.NodeName] = true
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled {
				started = append(started, c.LastTransitionTime.Time)
			}
		}
	}
	if len(seen) != 2 {
		t.Errorf("gang pods on %v, want one on each of %v", seen, big)
	}
	if len(started) == 2 {
		d := started[0].Sub(started[1]).Abs()
		t.Logf("gang started on %v, scheduled %v apart", big, d)
		if d > 10*time.Second {
			t.Errorf("gang pods scheduled %v apart, want together", d)
		}
	}
}

// TestFleetIsolation: claims prepared on each node are in that node's
// checkpoint and CDI dir only, also after the plugins of two nodes restart
// at random while pods come and go; every pod runs.
func TestFleetIsolation(t *testing.T) {
	ctx := testContext(t)
	nodes := useFleet(t, 2)
	ns := newNamespace(t, ctx, "e2e-fleet-isolation")
	claimTemplate(t, ctx, ns, "gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driverName})
	claimTemplate(t, ctx, ns, "ts", resourceapi.ExactDeviceRequest{DeviceClassName: "timeslice." + driverName})

	check := func(when string) {
		t.Helper()
		pods, err := env.cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		exclusive := map[string]string{} // node/device of a whole GPU -> claim
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				continue
			}
			claim := podClaim(t, ctx, &p)
			uid := string(claim.UID)
			// A whole GPU is one claim's (a share may have company).
			for _, r := range allocated(claim) {
				key := r.Pool + "/" + r.Device
				if other, ok := exclusive[key]; ok && !strings.HasPrefix(p.Name, "ts-") {
					t.Errorf("%s: GPU %s given to claims %s and %s", when, key, other, claim.Name)
				}
				if !strings.HasPrefix(p.Name, "ts-") {
					exclusive[key] = claim.Name
				}
			}
			for _, n := range nodes {
				cp, err := os.ReadFile(filepath.Join(nodeDir(t, n), "kubelet", "plugins", driverName, nodeplugin.CheckpointFile))
				if err != nil {
					t.Fatalf("%s: checkpoint of %s: %v", when, n, err)
				}
				specs, _ := filepath.Glob(filepath.Join(nodeDir(t, n), "cdi", "*"+uid+"*"))
				inCP := strings.Contains(string(cp), uid)
				if mine := n == p.Spec.NodeName; inCP != mine || (len(specs) > 0) != mine {
					t.Errorf("%s: claim %s of pod %s on %s: in %s's checkpoint %v, CDI specs %v", when, claim.Name, p.Name, p.Spec.NodeName, n, inCP, specs)
				}
			}
		}
	}
	for _, n := range nodes {
		for _, kind := range []string{"gpu", "ts"} {
			createPod(t, ctx, onNodes(newClaimPod(ns, kind+"-"+n, kind), n))
		}
	}
	for _, n := range nodes {
		for _, kind := range []string{"gpu", "ts"} {
			runningPod(t, ctx, ns, kind+"-"+n)
		}
	}
	check("all running")

	// The plugins of two nodes chosen at random restart, at random moments,
	// while pods come and go on every node. E2E_SEED replays a run.
	seed := time.Now().UnixNano()
	if v := os.Getenv("E2E_SEED"); v != "" {
		if _, err := fmt.Sscan(v, &seed); err != nil {
			t.Fatalf("E2E_SEED=%q: %v", v, err)
		}
	}
	t.Logf("seed %d (E2E_SEED=%d replays it)", seed, seed)
	rnd := rand.New(rand.NewPCG(uint64(seed), 0))
	for round := 0; round < 3; round++ {
		restarted := slices.Clone(nodes)
		rnd.Shuffle(len(restarted), func(i, j int) { restarted[i], restarted[j] = restarted[j], restarted[i] })
		restarted = restarted[:2]
		for _, n := range nodes {
			name := "churn-" + n
			if round > 0 {
				deletePod(t, ctx, ns, name)
			}
			createPod(t, ctx, onNodes(newClaimPod(ns, name, "gpu"), n))
		}
		for _, n := range restarted {
			time.Sleep(time.Duration(rnd.IntN(3000)) * time.Millisecond)
			old := pluginPodOn(t, ctx, n)
			t.Logf("round %d: restart %s's plugin (pod %s)", round+1, n, old.Name)
			if err := env.cluster.Client.CoreV1().Pods(env.namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range nodes {
			runningPod(t, ctx, ns, "churn-"+n)
		}
		check(fmt.Sprintf("after plugin restarts, round %d", round+1))
	}
}

// pluginPodOn is the running plugin pod of node.
func pluginPodOn(t *testing.T, ctx context.Context, node string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		pods, err := env.cluster.Client.CoreV1().Pods(env.namespace).List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/component=kubelet-plugin", FieldSelector: "spec.nodeName=" + node,
		})
		if err != nil {
			return false, nil
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				pod = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no running kubelet plugin pod on %s: %v", node, err)
	}
	return pod
}

// allocated lists the claim's allocated devices (none if unallocated).
func allocated(c *resourceapi.ResourceClaim) []resourceapi.DeviceRequestAllocationResult {
	if c.Status.Allocation == nil {
		return nil
	}
	return c.Status.Allocation.Devices.Results
}
