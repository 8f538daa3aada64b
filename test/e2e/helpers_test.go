package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// newNamespace creates a namespace for one test and deletes it (waiting until it
// is gone, so the node's devices are free again) when the test ends.
func newNamespace(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	c := env.cluster.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := c.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete namespace %s: %v", name, err)
			return
		}
		if err := poll(ctx, func(ctx context.Context) (bool, error) {
			_, err := c.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		}); err != nil {
			t.Errorf("namespace %s not deleted: %v", name, err)
		}
	})
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("no default service account in %s: %v", name, err)
	}
	return name
}

// claimTemplate creates a ResourceClaimTemplate with one request.
func claimTemplate(t *testing.T, ctx context.Context, ns, name string, req resourceapi.ExactDeviceRequest, config ...resourceapi.DeviceClaimConfiguration) {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "dev", Exactly: &req}},
			Config:   config,
		}}},
	}
	if _, err := env.cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create claim template %s/%s: %v", ns, name, err)
	}
}

func celSelector(expr string) []resourceapi.DeviceSelector {
	return []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}
}

// newClaimPod is a pod that sleeps with a claim from the template.
func newClaimPod(ns, name, template string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       sleeperSpec(corev1.PodResourceClaim{Name: "dev", ResourceClaimTemplateName: &template}),
	}
}

// claimPod creates a pod using a claim from the template and waits until it runs.
func claimPod(t *testing.T, ctx context.Context, ns, name, template string) *corev1.Pod {
	t.Helper()
	return runPod(t, ctx, newClaimPod(ns, name, template))
}

// runPod creates the pod and waits until it runs; a pod that does not run
// fails the test with its events.
func runPod(t *testing.T, ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if _, err := env.cluster.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	if err := env.runner.WaitPodRunning(ctx, pod.Namespace, pod.Name); err != nil {
		evs, _ := env.runner.PodEvents(ctx, pod.Namespace, pod.Name)
		t.Fatalf("%v; events: %s", err, strings.Join(evs, "; "))
	}
	got, err := env.cluster.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// sleeperSpec is a pod that sleeps in one container, which uses the claim
// (named "dev").
func sleeperSpec(claim corev1.PodResourceClaim) corev1.PodSpec {
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](1),
		ResourceClaims:                []corev1.PodResourceClaim{claim},
		Containers: []corev1.Container{{
			Name: "ctr", Image: "gdd.local/demo:v1", ImagePullPolicy: corev1.PullIfNotPresent,
			Command:   []string{"sleep", "86400"},
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: claim.Name}}},
		}},
	}
}

// podClaim returns the pod's (single) allocated claim.
func podClaim(t *testing.T, ctx context.Context, pod *corev1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod %s/%s: want one generated claim, have %+v", pod.Namespace, pod.Name, pod.Status.ResourceClaimStatuses)
	}
	claim, err := env.cluster.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *pod.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return claim
}

// cdiSpecPath is where the plugin writes the claim's CDI spec (docs/cdi.md).
func cdiSpecPath(claim *resourceapi.ResourceClaim) string {
	return filepath.Join(env.cdiDir, "k8s.gpu.dra.dev-gpu_"+string(claim.UID)+".json")
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// migUUIDs returns the UUIDs of the MIG devices (compute instances) that exist in
// the simulated machine's state file.
func migUUIDs(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(env.stateFile)
	if err != nil {
		t.Fatalf("read simulated state: %v", err)
	}
	var state struct {
		GPUs []struct {
			Index        int `json:"index"`
			GpuInstances []struct {
				Profile          string `json:"profile"`
				ComputeInstances []struct {
					UUID string `json:"uuid"`
				} `json:"computeInstances"`
			} `json:"gpuInstances"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(data, &state); err != nil {
		t.Fatalf("parse %s: %v", env.stateFile, err)
	}
	out := map[string]string{}
	for _, g := range state.GPUs {
		for _, gi := range g.GpuInstances {
			for _, ci := range gi.ComputeInstances {
				out[ci.UUID] = fmt.Sprintf("GPU %d %s", g.Index, gi.Profile)
			}
		}
	}
	return out
}

// containerEnv reads one variable inside the pod's container.
func containerEnv(t *testing.T, ctx context.Context, pod *corev1.Pod, name string) string {
	t.Helper()
	out, err := env.cluster.Exec(ctx, pod.Namespace, pod.Name, pod.Spec.Containers[0].Name, "sh", "-c", `eval echo "\$$0"`, name)
	if err != nil {
		t.Fatalf("read %s in %s/%s: %v", name, pod.Namespace, pod.Name, err)
	}
	return strings.TrimSpace(out)
}

func poll(ctx context.Context, cond wait.ConditionWithContextFunc) error {
	return wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, cond)
}

// waitGone waits until path no longer exists.
func waitGone(t *testing.T, ctx context.Context, path, what string) {
	t.Helper()
	if err := poll(ctx, func(context.Context) (bool, error) { return !fileExists(path), nil }); err != nil {
		t.Errorf("%s %s still exists: %v", what, path, err)
	}
}

// deletePod deletes a pod and waits until it is gone.
func deletePod(t *testing.T, ctx context.Context, ns, name string) {
	t.Helper()
	c := env.cluster.Client
	if err := c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod %s/%s: %v", ns, name, err)
	}
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("pod %s/%s not deleted: %v", ns, name, err)
	}
}
