package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// TestDrain: `kubectl drain --ignore-daemonsets --delete-emptydir-data`,
// without --force, of the GPU node with an MPS client, a whole-GPU pod, the
// client's MPS control daemon pod and the plugin completes: the clients are
// evicted, the daemon's eviction is refused (its PodDisruptionBudget) and the
// plugin removes it once its client's claim is unprepared, the plugin stays.
// After uncordon the MPS Deployment's new pod runs. The controller's pods are
// left out (--pod-selector): their budget keeps one of its two replicas,
// whose replacement cannot schedule on the cordoned only node.
func TestDrain(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx, "e2e-drain")
	claimTemplate(t, ctx, ns, "mps", resourceapi.ExactDeviceRequest{DeviceClassName: "mps." + driverName})
	claimTemplate(t, ctx, ns, "gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driverName})
	clients := map[string]*corev1.Pod{}
	for _, name := range []string{"mps", "gpu"} {
		claimDeployment(t, ctx, ns, name, name)
		clients[name] = waitDeploymentPod(t, ctx, ns, name, "")
	}
	mpsUUID := claimGPU(t, ctx, podClaim(t, ctx, clients["mps"]))
	daemons := mpsDaemonPods(t, ctx, mpsUUID)
	if len(daemons) != 1 {
		t.Fatalf("MPS control daemon pods for %s: %v, want one", mpsUUID, podNames(daemons))
	}
	daemon := daemons[0]
	plugin := pluginPod(t, ctx)

	t.Cleanup(func() { kubectl(t, context.Background(), "uncordon", env.node) })
	order := watchDeletions(ctx, ns, clients["mps"], &daemon)
	out, err := kubectlOutput(ctx, "drain", env.node, "--ignore-daemonsets", "--delete-emptydir-data",
		"--timeout=4m", "--pod-selector=app.kubernetes.io/component!=controller")
	evictedAt, daemonGoneAt := order()
	t.Logf("kubectl drain:\n%s", out)
	if err != nil {
		t.Fatalf("kubectl drain: %v", err)
	}
	if !strings.Contains(out, "drained") {
		t.Errorf("kubectl drain did not say the node is drained")
	}
	c := env.cluster.Client
	for name, pod := range clients {
		if p, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("client pod %s (%s) not evicted: %v %v", name, pod.Name, p.GetDeletionTimestamp(), err)
		}
	}
	if _, err := c.CoreV1().Pods(daemon.Namespace).Get(ctx, daemon.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("MPS control daemon pod %s left after the drain: %v", daemon.Name, err)
	}
	switch {
	case evictedAt.IsZero() || daemonGoneAt.IsZero():
		t.Errorf("the MPS client's eviction (%v) or its daemon's deletion (%v) was not seen", evictedAt, daemonGoneAt)
	case daemonGoneAt.Before(evictedAt):
		t.Errorf("the MPS daemon went at %v, before its client was evicted at %v", daemonGoneAt, evictedAt)
	}
	if !strings.Contains(out, daemon.Name) || !strings.Contains(out, "disruption budget") {
		t.Errorf("kubectl drain did not try to evict MPS daemon %s and get refused by its disruption budget", daemon.Name)
	}
	if p, err := c.CoreV1().Pods(plugin.Namespace).Get(ctx, plugin.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the drain took the kubelet plugin pod %s: %v", plugin.Name, err)
	}

	kubectl(t, ctx, "uncordon", env.node)
	waitDeploymentPod(t, ctx, ns, "mps", clients["mps"].UID)
}

// claimDeployment creates a one-replica Deployment whose pod uses a claim
// from the template: drain evicts only pods with a controller.
func claimDeployment(t *testing.T, ctx context.Context, ns, name, template string) {
	t.Helper()
	labels := map[string]string{"app": name}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       sleeperSpec(corev1.PodResourceClaim{Name: "dev", ResourceClaimTemplateName: &template}),
			},
		},
	}
	if _, err := env.cluster.Client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create deployment %s/%s: %v", ns, name, err)
	}
}

// waitDeploymentPod waits until a pod of the Deployment other than not
// runs, and returns it.
func waitDeploymentPod(t *testing.T, ctx context.Context, ns, name string, not types.UID) *corev1.Pod {
	t.Helper()
	var running *corev1.Pod
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		pods, err := env.cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			return false, nil
		}
		for i, p := range pods.Items {
			if p.UID != not && p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running = &pods.Items[i]
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no running pod of deployment %s/%s: %v", ns, name, err)
	}
	return running
}

// watchDeletions records, until the returned function is called, when the
// client pod was first seen evicted (deleting or gone) and when the daemon
// pod was.
func watchDeletions(ctx context.Context, ns string, client, daemon *corev1.Pod) func() (clientAt, daemonAt time.Time) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var clientAt, daemonAt time.Time
	seen := func(p *corev1.Pod) bool {
		got, err := env.cluster.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err) || err == nil && (got.UID != p.UID || got.DeletionTimestamp != nil)
	}
	wg.Go(func() {
		for ctx.Err() == nil && (clientAt.IsZero() || daemonAt.IsZero()) {
			// The client first: deletions seen in the same round cannot
			// be told apart, and count as in order.
			if clientAt.IsZero() && seen(client) {
				clientAt = time.Now()
			}
			if daemonAt.IsZero() && seen(daemon) {
				daemonAt = time.Now()
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return func() (time.Time, time.Time) {
		cancel()
		wg.Wait()
		return clientAt, daemonAt
	}
}

// kubectlOutput runs kubectl against the cluster under test.
func kubectlOutput(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, env.cluster.Kubectl, append([]string{"--kubeconfig", env.cluster.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

func kubectl(t *testing.T, ctx context.Context, args ...string) {
	t.Helper()
	if out, err := kubectlOutput(ctx, args...); err != nil {
		t.Errorf("%v\n%s", err, out)
	}
}
