package scenarios

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Runner applies scenarios and reports on them.
type Runner struct {
	Cluster *Cluster
	// Driver is the DRA driver name whose devices are reported (gpu.dra.dev).
	Driver string
	// Timeout bounds each wait (a pod becoming Running, a namespace going away).
	Timeout time.Duration
	// Settle is how long a pod expected to stay Pending is watched after the
	// others are running, to show it really stays Pending.
	Settle time.Duration
	// Logf, when set, reports progress.
	Logf func(format string, args ...any)
	// KubectlGPUPath is the kubectl-gpu binary (bin/kubectl-gpu after make build).
	KubectlGPUPath string
}

// NewRunner returns a runner with the defaults.
func NewRunner(c *Cluster) *Runner {
	return &Runner{Cluster: c, Driver: vocabulary.DriverName, Timeout: 3 * time.Minute, Settle: 5 * time.Second}
}

func (r *Runner) logf(format string, args ...any) {
	if r.Logf != nil {
		r.Logf(format, args...)
	}
}

// Apply creates the scenario's objects in file order. It waits for each pod that
// must run on its own (not Pending by design, not in a gang) before the next object,
// so that scenarios whose outcome depends on order (quota) are deterministic.
func (r *Runner) Apply(ctx context.Context, s *Scenario) error {
	for _, obj := range s.Objects {
		if err := r.Cluster.Apply(ctx, obj); err != nil {
			return err
		}
		if obj.GetKind() == "Namespace" {
			if err := r.waitServiceAccount(ctx, obj.GetName()); err != nil {
				return err
			}
		}
		if obj.GetKind() == "Pod" && obj.GetAPIVersion() == "v1" && expectRunning(obj.GetAnnotations()) && !inGang(obj) {
			if err := r.WaitPodRunning(ctx, obj.GetNamespace(), obj.GetName()); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitServiceAccount waits for the namespace's default service account: pods are
// refused until the controller made it.
func (r *Runner) waitServiceAccount(ctx context.Context, ns string) error {
	return r.poll(ctx, fmt.Sprintf("service account %s/default", ns), func(ctx context.Context) (bool, error) {
		_, err := r.Cluster.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

func expectRunning(ann map[string]string) bool {
	return !strings.EqualFold(ann[AnnotationExpect], string(corev1.PodPending))
}

func inGang(obj *unstructured.Unstructured) bool {
	_, found, _ := unstructured.NestedFieldNoCopy(obj.Object, "spec", "schedulingGroup")
	return found
}

// WaitPodRunning waits until the pod runs with all containers ready. A pod that
// fails, or whose events report a failed prepare, ends the wait early.
func (r *Runner) WaitPodRunning(ctx context.Context, ns, name string) error {
	return r.poll(ctx, fmt.Sprintf("pod %s/%s Running", ns, name), func(ctx context.Context) (bool, error) {
		pod, err := r.Cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		switch pod.Status.Phase {
		case corev1.PodRunning:
			return podReady(pod), nil
		case corev1.PodFailed, corev1.PodSucceeded:
			return false, fmt.Errorf("pod %s/%s is %s: %s", ns, name, pod.Status.Phase, pod.Status.Message)
		}
		return false, nil
	})
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Wait waits until every pod of the scenario's namespaces is where it should be:
// Running and ready, or — for pods annotated expect: Pending — still Pending and
// unbound after the others run and Settle has passed, with an event containing
// the expect-event text if one is given.
func (r *Runner) Wait(ctx context.Context, s *Scenario) error {
	for _, ns := range s.Namespaces() {
		err := r.poll(ctx, "pods of namespace "+ns, func(ctx context.Context) (bool, error) {
			pods, err := r.Cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for i := range pods.Items {
				pod := &pods.Items[i]
				if !expectRunning(pod.Annotations) {
					continue
				}
				if pod.Status.Phase == corev1.PodFailed {
					return false, fmt.Errorf("pod %s/%s failed: %s", ns, pod.Name, pod.Status.Message)
				}
				if pod.Status.Phase != corev1.PodRunning || !podReady(pod) {
					return false, nil
				}
			}
			return len(pods.Items) > 0, nil
		})
		if err != nil {
			return err
		}
		if err := r.waitPending(ctx, ns); err != nil {
			return err
		}
		if err := r.checkNodeLabels(ctx, ns); err != nil {
			return err
		}
	}
	return nil
}

// checkNodeLabels checks that each running pod of ns annotated with
// AnnotationExpectNodeLabel runs on a node with that label.
func (r *Runner) checkNodeLabels(ctx context.Context, ns string) error {
	pods, err := r.Cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		want := p.Annotations[AnnotationExpectNodeLabel]
		if want == "" || p.Spec.NodeName == "" {
			continue
		}
		key, value, _ := strings.Cut(want, "=")
		node, err := r.Cluster.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got, ok := node.Labels[key]; !ok || got != value {
			return fmt.Errorf("pod %s/%s runs on node %s with %s=%q, want %q", ns, p.Name, node.Name, key, got, value)
		}
	}
	return nil
}

// SetUnschedulable cordons (or uncordons) nodes, as kubectl cordon does:
// DaemonSet pods (the plugins) keep running, new pods go elsewhere.
func (r *Runner) SetUnschedulable(ctx context.Context, unschedulable bool, nodes ...string) error {
	patch := []byte(fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, unschedulable))
	for _, n := range nodes {
		if _, err := r.Cluster.Client.CoreV1().Nodes().Patch(ctx, n, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("node %s unschedulable=%t: %w", n, unschedulable, err)
		}
	}
	return nil
}

func (r *Runner) waitPending(ctx context.Context, ns string) error {
	pods, err := r.Cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var pending []corev1.Pod
	for _, p := range pods.Items {
		if !expectRunning(p.Annotations) {
			pending = append(pending, p)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	r.logf("watching %d pod(s) of %s that must stay Pending for %s", len(pending), ns, r.Settle)
	for _, p := range pending {
		if want := p.Annotations[AnnotationExpectEvent]; want != "" {
			err := r.poll(ctx, fmt.Sprintf("event %q on pod %s/%s", want, ns, p.Name), func(ctx context.Context) (bool, error) {
				msgs, err := r.PodEvents(ctx, ns, p.Name)
				if err != nil {
					return false, err
				}
				for _, m := range msgs {
					if strings.Contains(m, want) {
						return true, nil
					}
				}
				return false, nil
			})
			if err != nil {
				return err
			}
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(r.Settle):
	}
	for _, p := range pending {
		pod, err := r.Cluster.Client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodPending || pod.Spec.NodeName != "" {
			return fmt.Errorf("pod %s/%s must stay Pending and unbound, but is %s on node %q", ns, p.Name, pod.Status.Phase, pod.Spec.NodeName)
		}
	}
	return nil
}

// PodEvents returns the messages of the pod's events, oldest first.
func (r *Runner) PodEvents(ctx context.Context, ns, pod string) ([]string, error) {
	evs, err := r.Cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Pod,involvedObject.name=" + pod,
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out, nil
}

// Cleanup deletes the scenario's namespaces and waits until they are gone, so the
// node's devices are unprepared and free for the next scenario.
func (r *Runner) Cleanup(ctx context.Context, s *Scenario) error {
	return r.DeleteNamespaces(ctx, s.Namespaces()...)
}

// DeleteNamespaces deletes the namespaces and waits until they are gone.
func (r *Runner) DeleteNamespaces(ctx context.Context, namespaces ...string) error {
	for _, ns := range namespaces {
		err := r.Cluster.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	for _, ns := range namespaces {
		err := r.poll(ctx, "namespace "+ns+" deleted", func(ctx context.Context) (bool, error) {
			_, err := r.Cluster.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// poll runs cond every 500 ms until it returns true or an error, or Timeout.
func (r *Runner) poll(ctx context.Context, what string, cond wait.ConditionWithContextFunc) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, r.Timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil && (apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err)) {
			last = err
			return false, nil
		}
		return ok, err
	})
	if err == nil {
		return nil
	}
	if wait.Interrupted(err) {
		if last != nil {
			err = errors.Join(err, last)
		}
		return fmt.Errorf("timed out after %s waiting for %s: %w", r.Timeout, what, err)
	}
	return fmt.Errorf("waiting for %s: %w", what, err)
}
