package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// quickstartCommand replaces the quickstart containers' command: theirs run
// `bash -c "nvidia-smi -L; …"` (or the CUDA nbody sample /tmp/sample), and the
// demo image (busybox) has neither bash, nvidia-smi nor the sample, so the
// containers would exit at once. The test judges the specs by their claims'
// allocations instead of the containers' output.
var quickstartCommand = []any{"sh", "-c", "trap 'exit 0' TERM; sleep 9999 & wait"}

// quickstartOutcome is what a quickstart spec does on the local cluster's
// env.node (a simulated DGX H100: eight H100 80GB, MIG capable) with the
// profile on (demo/nvidia-quickstart/README.md).
type quickstartOutcome int

const (
	qsRuns          quickstartOutcome = iota // every pod Running with its devices
	qsUnschedulable                          // no device on the node matches the spec's selectors
	qsRefused                                // scheduled; the plugin refuses the config at prepare
)

// TestNVIDIAQuickstart switches the release to the compat.nvidia profile and
// applies NVIDIA's DRA driver quickstart specs (demo/nvidia-quickstart) as
// published, only the image and command swapped, each in its own namespace at
// once: the ones this driver serves run with the devices they ask for, the others
// fail the way demo/nvidia-quickstart/README.md says. While the profile is on it
// resolves a whole-GPU pod and a MIG pod the way dcgm-exporter's DRA mapping
// does (dcgmMapping) and checks that it names the devices the plugin prepared.
func TestNVIDIAQuickstart(t *testing.T) {
	ctx := testContext(t)
	const nv = vocabulary.NVIDIADriverName
	// Cleanups run last-registered first: the namespaces go, then the release
	// is restored, then this waits for the node's own slices again.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// dra-controller published the IMEX channel pools under the
		// profile's name; switched back, it deletes them itself (no kubelet
		// does: they have no node), without the operator's help
		// (docs/migration.md).
		if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			for _, s := range driverSlices(t, ctx, nv, "") { // the cleanup's ctx: a List cut off by the poll's deadline would be fatal
				if _, ok := vocabulary.ChannelPoolClique(s.Spec.Pool.Name); ok && s.Spec.NodeName == nil {
					return false, nil
				}
			}
			return true, nil
		}); err != nil {
			t.Errorf("dra-controller left its channel slices of %s more than a minute after the switch back: %v", nv, err)
		}
		if err := poll(ctx, func(ctx context.Context) (bool, error) {
			// The kubelet deletes the slices of the unregistered driver name
			// gpu.nvidia.com about 30s after; TestCoexistenceNVIDIADRADriver
			// must not find them.
			return len(driverSlices(t, ctx, driverName, env.node)) > 0 && len(driverSlices(t, ctx, nv, "")) == 0, nil
		}); err != nil {
			t.Errorf("after the release was restored, want %s slices on %s and none of %s: %v", driverName, env.node, nv, err)
		}
		extendedResourceAfterSwitch(t, ctx)
	})
	// The profile keeps the device model: as many slices, under the other name.
	slices := len(driverSlices(t, ctx, driverName, env.node))
	saveRelease(t, ctx)
	upgradeRelease(t, ctx, "--set", "compat.nvidia=true")
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		return len(driverSlices(t, ctx, nv, env.node)) == slices, nil
	}); err != nil {
		t.Fatalf("the node %s does not publish its %d slices under %s: %v", env.node, slices, nv, err)
	}
	devs := nodeDevices(t, ctx, nv, env.node)

	specs := []struct {
		file string
		want quickstartOutcome
		// check judges the running pods' claims (want == qsRuns).
		check func(t *testing.T, ctx context.Context, ns string, pods []corev1.Pod)
		// reason is in the pods' events (qsRefused) or scheduling condition (qsUnschedulable).
		reason string
	}{
		{file: "gpu-test1.yaml", want: qsRuns, check: func(t *testing.T, ctx context.Context, ns string, pods []corev1.Pod) {
			a, b := podDevices(t, ctx, devs, pods, "pod1"), podDevices(t, ctx, devs, pods, "pod2")
			wantGPUs(t, a, 1)
			wantGPUs(t, b, 1)
			if len(a) == 1 && len(b) == 1 && a[0].key == b[0].key {
				t.Errorf("pod1 and pod2 got the same GPU %s; the spec asks for one distinct GPU each", a[0].key)
			}
			checkDCGMMapping(t, ctx, devs, ns, "pod1", false)
		}},
		{file: "gpu-test2.yaml", want: qsRuns, check: func(t *testing.T, ctx context.Context, ns string, pods []corev1.Pod) {
			wantGPUs(t, podDevices(t, ctx, devs, pods, "pod"), 1) // one claim for both containers
		}},
		{file: "gpu-test3.yaml", want: qsRuns, check: func(t *testing.T, ctx context.Context, ns string, pods []corev1.Pod) {
			a, b := podDevices(t, ctx, devs, pods, "pod1"), podDevices(t, ctx, devs, pods, "pod2")
			wantGPUs(t, a, 1)
			if len(a) != 1 || len(b) != 1 || a[0].key != b[0].key {
				t.Errorf("the pods of the shared claim got %v and %v, want the same one GPU", a, b)
			}
		}},
		// The H100's MIG profiles are 1g.10gb, 2g.20gb, 3g.40gb, ...: the spec's
		// 1g.5gb/2g.10gb/3g.20gb (A100 40GB) match no device here.
		{file: "gpu-test4.yaml", want: qsUnschedulable, reason: "cannot allocate all claims"},
		{file: "gpu-test5.yaml", want: qsRefused, reason: "is not supported for it"},
		// productName matches no H100.
		{file: "gpu-test6.yaml", want: qsUnschedulable, reason: "cannot allocate all claims"},
		{file: "gpu-test-mps.yaml", want: qsRefused, reason: `sharing strategy "MPS" is not supported for it`},
	}
	// Guard the expectations against another machine: a node with the A100's
	// profiles would run gpu-test4 and gpu-test6 (the test then needs a case).
	for _, d := range devs {
		if d.attr("profile") == "1g.5gb" || strings.Contains(strings.ToLower(d.attr("productName")), "a100") {
			t.Skipf("%s has A100 devices (%s); the expectations are for H100 nodes", env.node, d.key)
		}
	}

	for _, s := range specs {
		t.Run(strings.TrimSuffix(s.file, ".yaml"), func(t *testing.T) {
			t.Parallel()
			ns := applyQuickstart(t, ctx, s.file)
			switch s.want {
			case qsRuns:
				pods := waitQuickstartPods(t, ctx, ns, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
				s.check(t, ctx, ns, pods)
			case qsUnschedulable:
				waitQuickstartPods(t, ctx, ns, func(p *corev1.Pod) bool {
					for _, c := range p.Status.Conditions {
						if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
							return strings.Contains(c.Message, s.reason)
						}
					}
					return false
				})
			case qsRefused:
				waitNamespaceEvent(t, ctx, ns, "FailedPrepareDynamicResources", s.reason)
			}
		})
	}
	// A MIG pod for the dcgm-exporter check (no quickstart spec runs MIG on an
	// H100), beside the specs: they leave one of the eight GPUs free.
	t.Run("dcgm-exporter-mig", func(t *testing.T) {
		t.Parallel()
		ns := newNamespace(t, ctx, "nvq-mig")
		claimTemplate(t, ctx, ns, "mig", resourceapi.ExactDeviceRequest{
			DeviceClassName: "mig.nvidia.com",
			Selectors:       celSelector(`device.attributes["gpu.nvidia.com"].profile == "1g.10gb"`),
		})
		claimPod(t, ctx, ns, "mig", "mig")
		checkDCGMMapping(t, ctx, devs, ns, "mig", true)
	})
}

// applyQuickstart applies a quickstart file with the command swapped
// (quickstartCommand) and returns its namespace, deleted when the test ends.
func applyQuickstart(t *testing.T, ctx context.Context, file string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(env.repoRoot, "demo", "nvidia-quickstart", file))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := scenarios.DecodeObjects(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	ns := ""
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			ns = o.GetName()
			continue
		}
		swapQuickstartCommand(t, o)
	}
	if ns == "" {
		t.Fatalf("%s creates no Namespace", file)
	}
	newNamespace(t, ctx, ns)
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			continue
		}
		if err := env.cluster.Apply(ctx, o); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	return ns
}

// swapQuickstartCommand sets quickstartCommand on the containers of a Pod or a
// Deployment's pod template; the image is the demo image in the files already.
func swapQuickstartCommand(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	var path []string
	switch o.GetKind() {
	case "Pod":
		path = []string{"spec", "containers"}
	case "Deployment":
		path = []string{"spec", "template", "spec", "containers"}
	default:
		return
	}
	ctrs, _, err := unstructured.NestedSlice(o.Object, path...)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ctrs {
		m := c.(map[string]any)
		if m["image"] != "gdd.local/demo:v1" {
			t.Fatalf("%s %s: container image %v, want the demo image", o.GetKind(), o.GetName(), m["image"])
		}
		m["command"] = quickstartCommand[:2]
		m["args"] = quickstartCommand[2:]
	}
	if err := unstructured.SetNestedSlice(o.Object, ctrs, path...); err != nil {
		t.Fatal(err)
	}
}

// waitQuickstartPods waits until the namespace has pods and every one satisfies
// ok, and returns them.
func waitQuickstartPods(t *testing.T, ctx context.Context, ns string, ok func(*corev1.Pod) bool) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		list, err := env.cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) == 0 {
			return false, nil
		}
		pods = list.Items
		for i := range pods {
			if !ok(&pods[i]) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		var states []string
		for _, p := range pods {
			states = append(states, p.Name+": "+string(p.Status.Phase))
			evs, _ := env.runner.PodEvents(ctx, ns, p.Name)
			states = append(states, evs...)
		}
		t.Fatalf("pods of %s: %v; %s", ns, err, strings.Join(states, "; "))
	}
	return pods
}

// waitNamespaceEvent waits for an event of reason whose message contains msg.
func waitNamespaceEvent(t *testing.T, ctx context.Context, ns, reason, msg string) {
	t.Helper()
	var seen []string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		evs, err := env.cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			if strings.Contains(e.Message, msg) {
				return true, nil
			}
			seen = append(seen, e.Message)
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event naming %q in %s: %v; seen: %s", reason, msg, ns, err, strings.Join(seen, "; "))
	}
}

// extendedResourceAfterSwitch checks that a pod asking nvidia.com/gpu runs
// after the profile was switched off again. Switching moves nvidia.com/gpu
// from DeviceClass gpu.nvidia.com to gpu.dra.dev: helm creates the new class
// before it deletes the old one, and kube-scheduler's extended resource cache
// (k8s.io/dynamic-resource-allocation v0.37.2 deviceclass/extendedresourcecache,
// removeResourceName2class) drops the name's mapping on the old class's delete
// although the new class now owns it; the scheduler then reports
// "Insufficient nvidia.com/gpu" until the class changes. The documented
// workaround (docs/migration.md) is any update of the new class.
func extendedResourceAfterSwitch(t *testing.T, ctx context.Context) {
	t.Helper()
	ns := newNamespace(t, ctx, "e2e-nvq-extended")
	pod := onNodes(newClaimPod(ns, "extended", ""), env.node)
	pod.Spec.ResourceClaims = nil
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}}
	createPod(t, ctx, pod)
	short, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if env.runner.WaitPodRunning(short, ns, "extended") == nil {
		t.Logf("nvidia.com/gpu pod runs after the switch back")
		return
	}
	evs, _ := env.runner.PodEvents(ctx, ns, "extended")
	t.Logf("nvidia.com/gpu pod not scheduled after the switch back (upstream extendedresourcecache lost the mapping): %s; touching DeviceClass %s", strings.Join(evs, "; "), driverName)
	patch := []byte(`{"metadata":{"annotations":{"` + driverName + `/resync":"` + time.Now().UTC().Format(time.RFC3339Nano) + `"}}}`)
	if _, err := env.cluster.Client.ResourceV1().DeviceClasses().Patch(ctx, driverName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// kube-scheduler does not retry a pod Pending on "Insufficient" when a
	// DeviceClass changes (only its periodic flush of unschedulable pods does,
	// within 5 minutes): a new pod shows the mapping is back.
	deletePod(t, ctx, ns, "extended")
	again := pod.DeepCopy()
	again.Name, again.ResourceVersion, again.UID = "extended-again", "", ""
	createPod(t, ctx, again)
	runningPod(t, ctx, ns, "extended-again")
	t.Logf("nvidia.com/gpu pod runs once DeviceClass %s was touched", driverName)
}
