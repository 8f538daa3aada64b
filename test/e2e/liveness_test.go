package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	w := startWorkload(t, ctx, "e2e-liveness")
	before := pluginPod(t, ctx)
	restarts := pluginRestarts(before)
	t.Cleanup(func() { // should the kubelet not restart it, do not leave it hung
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = env.runner.SimulateEvent(ctx, env.node, map[string]string{"hang": "false"})
	})
	if err := env.runner.SimulateEvent(ctx, env.node, map[string]string{"hang": "true"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var unready, restarted time.Duration
	err := poll(ctx, func(ctx context.Context) (bool, error) {
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
	t.Logf("plugin unready %v and restarted %v after NVML hung", unready, restarted)
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
	w.verifyIntact(t, ctx, "after the kubelet restarted the wedged plugin")
	claimPod(t, ctx, w.ns, "gpu-after-liveness-restart", "gpu")
	w.verifyUnprepare(t, ctx)
}
