package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
)

// modelPair is two nodes of one GPU model, env.node first.
func modelPair(t *testing.T, ctx context.Context, nodes []string) []string {
	t.Helper()
	for _, ns := range productNodes(t, ctx, nodes) {
		for _, n := range ns {
			if n == env.node && len(ns) >= 2 {
				pair := []string{env.node}
				for _, m := range ns {
					if m != env.node && len(pair) < 2 {
						pair = append(pair, m)
					}
				}
				return pair
			}
		}
	}
	t.Skipf("needs a second node of %s's GPU model", env.node)
	return nil
}

// TestFleetNodeDown: one node's trouble leaves the others serving.
//   - wedged: one node's plugin stopped (SIGSTOP): only that node's devices
//     are tainted, new GPU pods go to the other node; resumed: untainted.
//   - drained: its GPU pods (Deployments) move to the other node, the MPS
//     control daemon goes after its client.
//   - kubelet restarted: the pod and its prepared claim survive, a new pod
//     on that node runs.
func TestFleetNodeDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	t.Cleanup(cancel)
	nodes := useFleet(t, 2)
	pair := modelPair(t, ctx, nodes)
	home, other := pair[0], pair[1]
	ns := newNamespace(t, ctx, "e2e-fleet-down")
	claimTemplate(t, ctx, ns, "gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driverName})
	claimTemplate(t, ctx, ns, "mps", resourceapi.ExactDeviceRequest{DeviceClassName: "mps." + driverName})
	c := env.cluster.Client

	t.Run("wedged", func(t *testing.T) {
		saveRelease(t, ctx)
		upgradeRelease(t, ctx, "--set", "kubeletPlugin.probes.port=0", "--set", "controller.outage.gracePeriod="+outageGrace.String())
		pid := pluginProcessOn(t, ctx, other)
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP the plugin of %s (pid %d): %v", other, pid, err)
		}
		resumed := false
		t.Cleanup(func() {
			if !resumed {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		})
		rule := waitRuleFor(t, ctx, other, true)
		t.Logf("%s's plugin stopped: rule %s (%s)", other, rule.Name, rule.Spec.Taint.Effect)
		rules, err := c.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rules.Items {
			if r.Name != rule.Name && strings.Contains(r.Name, "outage") {
				t.Errorf("rule %s besides %s's: only the wedged node's devices may be tainted", r.Name, other)
			}
		}
		for _, name := range []string{"while-wedged-0", "while-wedged-1"} {
			createPod(t, ctx, onNodes(newClaimPod(ns, name, "gpu"), pair...))
			if p := runningPod(t, ctx, ns, name); p.Spec.NodeName != home {
				t.Errorf("pod %s went to %s while its plugin is wedged, want %s", name, p.Spec.NodeName, home)
			}
		}
		resumed = true
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		waitRuleFor(t, ctx, other, false)
		t.Logf("resumed: %s untainted", other)
		for _, name := range []string{"while-wedged-0", "while-wedged-1"} {
			deletePod(t, ctx, ns, name)
		}
	})

	t.Run("drained", func(t *testing.T) {
		// Only home schedulable: the clients start there; then only other
		// besides it, where they must move.
		var rest []string
		for _, n := range nodes {
			if n != home {
				rest = append(rest, n)
			}
		}
		if err := env.runner.SetUnschedulable(ctx, true, rest...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := env.runner.SetUnschedulable(context.Background(), false, nodes...); err != nil {
				t.Error(err)
			}
		})
		clients := map[string]*corev1.Pod{}
		for _, name := range []string{"mps", "gpu"} {
			claimDeployment(t, ctx, ns, name, name)
			clients[name] = waitDeploymentPod(t, ctx, ns, name, "")
			if clients[name].Spec.NodeName != home {
				t.Fatalf("deployment %s's pod on %s, want %s", name, clients[name].Spec.NodeName, home)
			}
		}
		daemons := mpsDaemonPods(t, ctx, claimGPU(t, ctx, podClaim(t, ctx, clients["mps"])))
		if len(daemons) != 1 {
			t.Fatalf("MPS control daemon pods: %v, want one", podNames(daemons))
		}
		kubectl(t, ctx, "uncordon", other)
		order := watchDeletions(ctx, ns, clients["mps"], &daemons[0])
		out, err := kubectlOutput(ctx, "drain", home, "--ignore-daemonsets", "--delete-emptydir-data",
			"--timeout=4m", "--pod-selector=app.kubernetes.io/component!=controller")
		evictedAt, daemonGoneAt := order()
		if err != nil {
			t.Fatalf("kubectl drain %s: %v\n%s", home, err, out)
		}
		if daemonGoneAt.IsZero() || evictedAt.IsZero() || daemonGoneAt.Before(evictedAt) {
			t.Errorf("MPS daemon gone at %v, its client evicted at %v: want the daemon last", daemonGoneAt, evictedAt)
		}
		for name, old := range clients {
			p := waitDeploymentPod(t, ctx, ns, name, old.UID)
			if p.Spec.NodeName != other {
				t.Errorf("deployment %s's new pod on %s, want %s", name, p.Spec.NodeName, other)
			}
			t.Logf("deployment %s moved %s -> %s", name, home, p.Spec.NodeName)
		}
		for _, name := range []string{"mps", "gpu"} {
			if err := c.AppsV1().Deployments(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Error(err)
			}
		}
	})

	t.Run("kubelet-restart", func(t *testing.T) {
		createPod(t, ctx, onNodes(newClaimPod(ns, "survivor", "gpu"), other))
		pod := runningPod(t, ctx, ns, "survivor")
		claim := podClaim(t, ctx, pod)
		k := stopKubeletOn(t, ctx, other)
		time.Sleep(15 * time.Second)
		k.start(t, ctx)
		checkUntouched(t, ctx, pod, "after "+other+"'s kubelet restart")
		cp, err := os.ReadFile(filepath.Join(nodeDir(t, other), "kubelet", "plugins", driverName, nodeplugin.CheckpointFile))
		if err != nil || !strings.Contains(string(cp), string(claim.UID)) {
			t.Errorf("claim %s not in %s's checkpoint after the kubelet restart: %v", claim.Name, other, err)
		}
		createPod(t, ctx, onNodes(newClaimPod(ns, "after-restart", "gpu"), other))
		runningPod(t, ctx, ns, "after-restart")
	})
}
