package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// pluginRestarts is the plugin container's restart count in pod.
func pluginRestarts(pod *corev1.Pod) int32 {
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == "plugin" {
			return s.RestartCount
		}
	}
	return 0
}

// TestLivenessRestartsWedgedPlugin: a plugin whose NVML hangs (POST
// /simulate/event?hang=true) turns unready, then fails its liveness probe,
// and the kubelet restarts its container (the same pod, restartCount + 1);
// the restarted plugin is not hung (the hang lives in the process), turns
// ready, keeps what the running pods' claims prepared, and prepares and
// unprepares claims again.
func TestLivenessRestartsWedgedPlugin(t *testing.T) {
	ctx := testContext(t)
	w, before, restarts := wedgePlugin(t, ctx, "e2e-liveness", "hang")
	waitPluginRestart(t, ctx, before, restarts, poll, "NVML hung")
	w.verifyIntact(t, ctx, "after the kubelet restarted the wedged plugin")
	claimPod(t, ctx, w.ns, "gpu-after-liveness-restart", "gpu")
	w.verifyUnprepare(t, ctx)
}

// wedgePlugin runs the workload in ns, then wedges the plugin with POST
// /simulate/event?<hang>=true (hang or hangsave), undone when the test
// ends should the kubelet not restart it. It returns the workload, the
// plugin pod and its restart count before.
func wedgePlugin(t *testing.T, ctx context.Context, ns, hang string) (*workload, *corev1.Pod, int32) {
	t.Helper()
	w := startWorkload(t, ctx, ns)
	before := pluginPod(t, ctx)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = env.runner.SimulateEvent(ctx, env.node, map[string]string{hang: "false"})
	})
	if err := env.runner.SimulateEvent(ctx, env.node, map[string]string{hang: "true"}); err != nil {
		t.Fatal(err)
	}
	return w, before, pluginRestarts(before)
}

// waitPluginRestart waits, with until, until the kubelet restarted the
// container of the plugin pod before (restartCount above restarts) after
// what wedged it, and checks that the pod turned unready first, then ready
// again in place.
func waitPluginRestart(t *testing.T, ctx context.Context, before *corev1.Pod, restarts int32,
	until func(context.Context, wait.ConditionWithContextFunc) error, what string) {
	t.Helper()
	start := time.Now()
	var unready, restarted time.Duration
	err := until(ctx, func(ctx context.Context) (bool, error) {
		pod, err := env.cluster.Client.CoreV1().Pods(env.namespace).Get(ctx, before.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.ContainersReady && c.Status != corev1.ConditionTrue && unready == 0 {
				unready = time.Since(start)
			}
		}
		if pluginRestarts(pod) > restarts {
			restarted = time.Since(start)
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the kubelet did not restart the wedged plugin (restartCount %d): %v", restarts, err)
	}
	t.Logf("plugin unready %v and restarted %v after %s", unready, restarted, what)
	if unready == 0 || unready > restarted {
		t.Errorf("the plugin did not turn unready before its restart (unready at %v, restarted at %v)", unready, restarted)
	}
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		pod, err := env.cluster.Client.CoreV1().Pods(env.namespace).Get(ctx, before.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady {
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the restarted plugin did not turn ready: %v", err)
	}
	if p := pluginPod(t, ctx); p.UID != before.UID {
		t.Errorf("the plugin pod was replaced (%s), want its container restarted in place", p.Name)
	}
}

// TestLivenessRestartsWedgedEngine: a plugin whose checkpoint saves hang
// (POST /simulate/event?hangsave=true) while its sockets and NVML answer
// hangs the prepare of a new pod's claim. The engine check turns it unready
// once that prepare ran past --engine-stall-bound (the chart's 1m), its
// liveness fails, and the kubelet restarts its container; the restarted
// plugin is not wedged (the hang lives in the process), prepares the
// claim the kubelet retries, so the new pod runs, and keeps what the
// running pods' claims prepared.
func TestLivenessRestartsWedgedEngine(t *testing.T) {
	// The stall bound, the plugin's and the kubelet's thresholds add up
	// to about two minutes before the restart.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	w, before, restarts := wedgePlugin(t, ctx, "e2e-wedge", "hangsave")
	if _, err := env.cluster.Client.CoreV1().Pods(w.ns).Create(ctx, newClaimPod(w.ns, "wedged", "gpu"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPluginRestart(t, ctx, before, restarts, func(ctx context.Context, cond wait.ConditionWithContextFunc) error {
		return wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, cond)
	}, "its checkpoint saves hung")
	if err := env.runner.WaitPodRunning(ctx, w.ns, "wedged"); err != nil {
		t.Fatalf("the pod whose prepare was wedged does not run after the plugin restarted: %v", err)
	}
	w.verifyIntact(t, ctx, "after the kubelet restarted the plugin wedged in a save")
	deletePod(t, ctx, w.ns, "wedged")
	w.verifyUnprepare(t, ctx)
}
