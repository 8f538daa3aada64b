package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
)

// The Volcano tests run the Jobs of demo/volcano on vc-scheduler and
// vc-controller-manager, which hack/demo/e2e.sh starts with hack/volcano/up.sh
// (from ../shared/volcano) beside the local cluster.

var (
	volcanoJobs     = schema.GroupVersionResource{Group: "batch.volcano.sh", Version: "v1alpha1", Resource: "jobs"}
	volcanoQueues   = schema.GroupVersionResource{Group: "scheduling.volcano.sh", Version: "v1beta1", Resource: "queues"}
	volcanoJobLabel = "volcano.sh/job-name"
)

// needVolcano skips, saying why, where hack/volcano/up.sh could not start Volcano.
func needVolcano(t *testing.T) {
	t.Helper()
	if reason := os.Getenv("E2E_VOLCANO_SKIP"); reason != "" {
		t.Skipf("Volcano skipped: %s", reason)
	}
	if os.Getenv("E2E_VOLCANO") != "1" {
		t.Skip("Volcano not started (E2E_VOLCANO unset): hack/demo/e2e.sh starts it with hack/volcano/up.sh")
	}
}

// applyDemoFile creates the objects of a demo/volcano file in ns (its own
// Namespace objects are left out) and returns them.
func applyDemoFile(t *testing.T, ctx context.Context, file, ns string, edit func(*unstructured.Unstructured)) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(env.repoRoot, "demo", "volcano", file))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := scenarios.DecodeObjects(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			continue
		}
		o.SetNamespace(ns)
		if edit != nil {
			edit(o)
		}
		if err := env.cluster.Apply(ctx, o); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out = append(out, o)
	}
	return out
}

// jobPods lists the pods of a Volcano Job.
func jobPods(t *testing.T, ctx context.Context, ns, job string) []corev1.Pod {
	t.Helper()
	pods, err := env.cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: volcanoJobLabel + "=" + job})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// waitJobRunning waits until n pods of the job run and returns them.
func waitJobRunning(t *testing.T, ctx context.Context, ns, job string, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		pods = jobPods(t, ctx, ns, job)
		running := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == n && len(pods) == n, nil
	})
	if err != nil {
		t.Fatalf("job %s/%s: want %d pods Running, have %s; events: %s", ns, job, n, podPhases(pods), jobEvents(ctx, ns, pods))
	}
	return pods
}

// assertJobHoldsNothing checks, for hold, that no pod of the job is bound and
// no claim of its pods is allocated.
func assertJobHoldsNothing(t *testing.T, ctx context.Context, ns, job string, hold time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(hold); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		pods := jobPods(t, ctx, ns, job)
		for _, p := range pods {
			if p.Spec.NodeName != "" {
				t.Fatalf("pod %s of the gang bound to %s while the gang cannot fit (pods: %s)", p.Name, p.Spec.NodeName, podPhases(pods))
			}
		}
		claims, err := env.cluster.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range claims.Items {
			if c.Status.Allocation != nil && strings.HasPrefix(c.Name, job+"-") {
				t.Fatalf("claim %s allocated while its gang cannot fit", c.Name)
			}
		}
	}
}

func podPhases(pods []corev1.Pod) string {
	var s []string
	for _, p := range pods {
		s = append(s, fmt.Sprintf("%s=%s@%s", p.Name, p.Status.Phase, p.Spec.NodeName))
	}
	return "[" + strings.Join(s, " ") + "]"
}

func jobEvents(ctx context.Context, ns string, pods []corev1.Pod) string {
	var out []string
	for _, p := range pods {
		evs, _ := env.runner.PodEvents(ctx, ns, p.Name)
		if len(evs) > 0 {
			out = append(out, p.Name+": "+evs[len(evs)-1])
		}
	}
	return strings.Join(out, "; ")
}

// blockGPUs runs a default-scheduler pod on node holding n whole GPUs and
// returns its name.
func blockGPUs(t *testing.T, ctx context.Context, ns, node string, n int) string {
	t.Helper()
	name := fmt.Sprintf("blocker-%d", n)
	claimTemplate(t, ctx, ns, name, resourceapi.ExactDeviceRequest{DeviceClassName: driverName,
		AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(n)})
	createPod(t, ctx, onNodes(newClaimPod(ns, name, name), node))
	runningPod(t, ctx, ns, name)
	return name
}

// TestVolcanoGangJob: the gang Job of the guide this driver replaces, as users
// write it (4 pods x nvidia.com/gpu: 2, demo/volcano/tensorflow-job.yaml) and
// with claim templates (demo/volcano/gang-job.yaml), on one node of 8 GPUs:
// with 6 free none of the 4 pods is bound and none of their claims is
// allocated, whatever Volcano's backfill does; once 8 are free all 4 run.
func TestVolcanoGangJob(t *testing.T) {
	needVolcano(t)
	ctx := testContext(t)
	per := len(nodeDevicesOfType(t, ctx, env.node, "gpu"))
	if per < 8 {
		t.Skipf("needs a node of 8 GPUs, %s has %d", env.node, per)
	}
	for _, tc := range []struct{ file, job string }{
		{"tensorflow-job.yaml", "tensorflow-job"},
		{"gang-job.yaml", "train"},
	} {
		t.Run(tc.job, func(t *testing.T) {
			ns := newNamespace(t, ctx, "e2e-volcano-"+tc.job)
			blocker := blockGPUs(t, ctx, ns, env.node, per-6)
			applyDemoFile(t, ctx, tc.file, ns, nil)
			// The job controller creates the pods once the PodGroup is enqueued.
			if err := poll(ctx, func(ctx context.Context) (bool, error) { return len(jobPods(t, ctx, ns, tc.job)) == 4, nil }); err != nil {
				t.Fatalf("Volcano created %d of 4 pods of %s", len(jobPods(t, ctx, ns, tc.job)), tc.job)
			}
			assertJobHoldsNothing(t, ctx, ns, tc.job, 30*time.Second)
			t.Logf("%s with 6 of %d GPUs free: 4 pods Pending, no claim allocated (%s)", tc.job, per, jobEvents(ctx, ns, jobPods(t, ctx, ns, tc.job)))

			freed := time.Now()
			deletePod(t, ctx, ns, blocker)
			pods := waitJobRunning(t, ctx, ns, tc.job, 4)
			var gpus []string
			for _, p := range pods {
				c := podClaim(t, ctx, &p)
				for _, r := range c.Status.Allocation.Devices.Results {
					gpus = append(gpus, r.Device)
				}
			}
			slices.Sort(gpus)
			if len(slices.Compact(gpus)) != 8 {
				t.Errorf("the 4 pods hold %v, want 8 distinct GPUs", gpus)
			}
			t.Logf("%s: all 4 pods Running %v after the blocker went, on %s", tc.job, time.Since(freed).Round(time.Second), podPhases(pods))
		})
	}
}

// TestVolcanoGangAcrossNodes: a gang no single node can hold (4 pods x 4
// GPUs) runs over several nodes.
func TestVolcanoGangAcrossNodes(t *testing.T) {
	needVolcano(t)
	ctx := testContext(t)
	useFleet(t, 2)
	ns := newNamespace(t, ctx, "e2e-volcano-fleet")
	applyDemoFile(t, ctx, "tensorflow-job.yaml", ns, func(o *unstructured.Unstructured) {
		if o.GetKind() != "Job" {
			return
		}
		tasks, _, _ := unstructured.NestedSlice(o.Object, "spec", "tasks")
		ctrs, _, _ := unstructured.NestedSlice(tasks[0].(map[string]any), "template", "spec", "containers")
		if err := unstructured.SetNestedField(ctrs[0].(map[string]any), "4", "resources", "limits", "nvidia.com/gpu"); err != nil {
			t.Fatal(err)
		}
		_ = unstructured.SetNestedSlice(tasks[0].(map[string]any), ctrs, "template", "spec", "containers")
		_ = unstructured.SetNestedSlice(o.Object, tasks, "spec", "tasks")
	})
	pods := waitJobRunning(t, ctx, ns, "tensorflow-job", 4)
	nodes := map[string]bool{}
	for _, p := range pods {
		nodes[p.Spec.NodeName] = true
	}
	if len(nodes) < 2 {
		t.Errorf("16 GPUs on %d node(s): %s", len(nodes), podPhases(pods))
	}
	t.Logf("4 pods x 4 GPUs over %d nodes: %s", len(nodes), podPhases(pods))
}

// TestVolcanoQueueQuota: a Queue whose capability is 4 GPUs of the class runs
// one Job of 2 pods x 2 GPUs and keeps a second waiting, with Volcano's
// reason, until the first ends.
func TestVolcanoQueueQuota(t *testing.T) {
	needVolcano(t)
	ctx := testContext(t)
	for _, tc := range []struct{ name, key string }{
		{"deviceclass", "deviceclass/" + driverName},
		// As teams wrote it for the device plugin: dra-controller adds the
		// deviceclass/ key Volcano's capacity plugin reads (docs/migration.md).
		{"nvidia", "nvidia.com/gpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queue := "e2e-team-" + tc.name
			q := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
				"metadata": map[string]any{"name": queue},
				"spec":     map[string]any{"reclaimable": false, "capability": map[string]any{tc.key: "4"}},
			}}
			if err := env.cluster.Apply(ctx, q); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = env.cluster.Dynamic.Resource(volcanoQueues).Delete(context.Background(), queue, metav1.DeleteOptions{})
			})
			if err := poll(ctx, func(ctx context.Context) (bool, error) {
				o, err := env.cluster.Dynamic.Resource(volcanoQueues).Get(ctx, queue, metav1.GetOptions{})
				if err != nil {
					return false, nil
				}
				s, _, _ := unstructured.NestedString(o.Object, "status", "state")
				return s == "Open", nil
			}); err != nil {
				t.Fatalf("queue %s never opened", queue)
			}
			got, err := env.cluster.Dynamic.Resource(volcanoQueues).Get(ctx, queue, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			capability, _, _ := unstructured.NestedStringMap(got.Object, "spec", "capability")
			if capability["deviceclass/"+driverName] != "4" {
				t.Fatalf("queue %s capability %v: want deviceclass/%s: 4", queue, capability, driverName)
			}
			t.Logf("queue %s: capability %v (annotations %v)", queue, capability, got.GetAnnotations())
			ns := newNamespace(t, ctx, "e2e-volcano-quota-"+tc.name)
			for _, job := range []string{"first", "second"} {
				applyDemoFile(t, ctx, "tensorflow-job.yaml", ns, func(o *unstructured.Unstructured) {
					if o.GetKind() != "Job" {
						return
					}
					o.SetName(job)
					_ = unstructured.SetNestedField(o.Object, queue, "spec", "queue")
					_ = unstructured.SetNestedField(o.Object, int64(2), "spec", "minAvailable")
					tasks, _, _ := unstructured.NestedSlice(o.Object, "spec", "tasks")
					_ = unstructured.SetNestedField(tasks[0].(map[string]any), int64(2), "replicas")
					_ = unstructured.SetNestedSlice(o.Object, tasks, "spec", "tasks")
				})
				if job == "first" {
					waitJobRunning(t, ctx, ns, job, 2)
				}
			}
			assertJobHoldsNothing(t, ctx, ns, "second", 20*time.Second)
			t.Logf("queue %s (capability %s: 4): second job waits: %s", queue, tc.key, jobEvents(ctx, ns, jobPods(t, ctx, ns, "second")))
			if err := env.cluster.Dynamic.Resource(volcanoJobs).Namespace(ns).Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			waitJobRunning(t, ctx, ns, "second", 2)
			t.Logf("queue %s: second job runs once the first is gone", queue)
		})
	}
}

// TestVolcanoTwoSchedulers: kube-scheduler and vc-scheduler each keep their
// in-flight DRA allocations in memory, so both may give the last free GPU of
// a node to a claim at the same moment. Rounds of two pods created at once
// (one per scheduler) for one free GPU: never do both run, and a pod whose
// claim got a GPU that the other already holds does not hang silently: the
// plugin refuses its prepare and the kubelet reports why on the pod.
func TestVolcanoTwoSchedulers(t *testing.T) {
	needVolcano(t)
	ctx := testContext(t)
	per := len(nodeDevicesOfType(t, ctx, env.node, "gpu"))
	ns := newNamespace(t, ctx, "e2e-volcano-two")
	blockGPUs(t, ctx, ns, env.node, per-1)
	claimTemplate(t, ctx, ns, "one", resourceapi.ExactDeviceRequest{DeviceClassName: driverName})
	raced := 0
	for round := range 5 {
		names := []string{fmt.Sprintf("default-%d", round), fmt.Sprintf("volcano-%d", round)}
		pods := []*corev1.Pod{onNodes(newClaimPod(ns, names[0], "one"), env.node), onNodes(newClaimPod(ns, names[1], "one"), env.node)}
		pods[1].Spec.SchedulerName = "volcano"
		done := make(chan error, 2)
		for _, p := range pods {
			go func() {
				_, err := env.cluster.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
				done <- err
			}()
		}
		for range pods {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		// Settle: one runs; the other is Pending, or bound and refused at prepare.
		var running, refused []string
		err := poll(ctx, func(ctx context.Context) (bool, error) {
			running, refused = nil, nil
			bound := 0
			for _, n := range names {
				p, err := env.cluster.Client.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{})
				if err != nil {
					return false, nil
				}
				if p.Spec.NodeName != "" {
					bound++
				}
				if p.Status.Phase == corev1.PodRunning {
					running = append(running, n)
					continue
				}
				evs, _ := env.runner.PodEvents(ctx, ns, n)
				for _, e := range evs {
					if strings.Contains(e, "already prepared for claim") {
						refused = append(refused, n+": "+e)
						break
					}
				}
			}
			return len(running) == 1 && (bound == 1 || len(refused) == 1) || len(running) == 2, nil
		})
		if err != nil {
			t.Fatalf("round %d: running %v, refused %v: neither settled", round, running, refused)
		}
		if len(running) == 2 {
			t.Fatalf("round %d: both pods run on one free GPU", round)
		}
		if len(refused) > 0 {
			raced++
			t.Logf("round %d: both schedulers gave out the same GPU; %s runs, the plugin refused the other: %s", round, running[0], refused[0])
		} else {
			t.Logf("round %d: %s runs, the other waits in its scheduler", round, running[0])
		}
		for _, n := range names {
			deletePod(t, ctx, ns, n)
		}
	}
	t.Logf("%d of 5 rounds raced (both schedulers allocated the same GPU); operators keep the two schedulers on separate node pools (docs/volcano.md)", raced)

	// The race itself, made certain: two claims given the node's free GPU,
	// as two schedulers that each allocated it would write them, and their
	// pods bound to the node. One runs; the other's prepare is refused with
	// the plugin's reason as an event on the pod.
	gpu, pool := freeGPU(t, ctx, env.node)
	names := []string{"first", "second"}
	for _, n := range names {
		doubleAllocated(t, ctx, ns, n, pool, gpu)
	}
	var running, refused string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		for _, n := range names {
			p, err := env.cluster.Client.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if p.Status.Phase == corev1.PodRunning {
				running = n
				continue
			}
			evs, _ := env.runner.PodEvents(ctx, ns, n)
			for _, e := range evs {
				if strings.Contains(e, "already prepared for claim") {
					refused = n + ": " + e
				}
			}
		}
		return running != "" && refused != "", nil
	})
	if err != nil {
		t.Fatalf("%s given to two claims: running %q, refused %q", gpu, running, refused)
	}
	t.Logf("%s given to two claims at once: %s runs; %s", gpu, running, refused)
}

// freeGPU returns a whole GPU of node that no claim holds, and its pool,
// once there is one (claims of deleted pods go shortly after them).
func freeGPU(t *testing.T, ctx context.Context, node string) (string, string) {
	t.Helper()
	var gpu, pool string
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		gpu, pool = freeGPUNow(t, ctx, node)
		return gpu != "", nil
	}); err != nil {
		t.Fatalf("no free GPU on %s", node)
	}
	return gpu, pool
}

func freeGPUNow(t *testing.T, ctx context.Context, node string) (string, string) {
	t.Helper()
	claims, err := env.cluster.Client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, c := range claims.Items {
		if c.Status.Allocation != nil {
			for _, r := range c.Status.Allocation.Devices.Results {
				held[r.Pool+"/"+r.Device] = true
			}
		}
	}
	for _, s := range nodeSlices(t, ctx, node) {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes["type"]; ok && a.StringValue != nil && *a.StringValue == "gpu" && !held[s.Spec.Pool.Name+"/"+d.Name] {
				return d.Name, s.Spec.Pool.Name
			}
		}
	}
	return "", ""
}

// doubleAllocated creates a claim allocated gpu of pool on env.node, as a
// scheduler writes it, and a pod bound to the node that uses it.
func doubleAllocated(t *testing.T, ctx context.Context, ns, name, pool, gpu string) {
	t.Helper()
	claims := env.cluster.Client.ResourceV1().ResourceClaims(ns)
	c, err := claims.Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driverName}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := newClaimPod(ns, name, "")
	pod.Spec.ResourceClaims[0] = corev1.PodResourceClaim{Name: "dev", ResourceClaimName: &c.Name}
	pod.Spec.NodeName = env.node
	created, err := env.cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: driverName, Pool: pool, Device: gpu}}}}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: created.Name, UID: created.UID}}
	if _, err := claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate claim %s: %v", name, err)
	}
}

// TestVolcanoBackfillWithoutGangGuard is the evidence for the gang guard
// (docs/upstream-volcano.md): with it off, the gang of claim-template pods
// that cannot fit (6 of 8 GPUs free) is bound in part by Volcano's backfill
// action, which binds best-effort tasks one by one, and its claims hold GPUs
// for a job that cannot run. When Volcano counts claims in its best-effort
// test this fails, and the guard can go.
func TestVolcanoBackfillWithoutGangGuard(t *testing.T) {
	needVolcano(t)
	ctx := testContext(t)
	per := len(nodeDevicesOfType(t, ctx, env.node, "gpu"))
	if per < 8 {
		t.Skipf("needs a node of 8 GPUs, %s has %d", env.node, per)
	}
	saveRelease(t, ctx)
	upgradeRelease(t, ctx, "--set", "controller.requestTranslation.gangGuard=false")
	ns := newNamespace(t, ctx, "e2e-volcano-noguard")
	blockGPUs(t, ctx, ns, env.node, per-6)
	applyDemoFile(t, ctx, "gang-job.yaml", ns, nil)
	var bound []string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		bound = nil
		for _, p := range jobPods(t, ctx, ns, "train") {
			if p.Spec.NodeName != "" {
				bound = append(bound, p.Name)
			}
		}
		return len(bound) > 0, nil
	})
	if err != nil {
		t.Fatalf("without the gang guard no pod of the gang was bound: Volcano's backfill no longer breaks gangs of claim-only pods, and the guard may go (docs/upstream-volcano.md)")
	}
	time.Sleep(10 * time.Second) // backfill's later cycles
	pods := jobPods(t, ctx, ns, "train")
	t.Logf("gang guard off, 6 of %d GPUs free: backfill bound pods of a gang that cannot run: %s", per, podPhases(pods))
	// Delete the gang before the release (and the guard) is restored.
	if err := env.cluster.Dynamic.Resource(volcanoJobs).Namespace(ns).Delete(ctx, "train", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
