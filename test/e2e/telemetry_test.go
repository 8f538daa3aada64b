package e2e

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestTelemetryContainerLabel: the device readings of a running pod's GPU,
// scraped from the plugin's /metrics, carry the pod's namespace, the
// generated claim and the container that uses the claim, and never the
// pod's other container.
func TestTelemetryContainerLabel(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx, "e2e-telemetry")
	claimTemplate(t, ctx, ns, "gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driverName})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: ns},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu")}},
			Containers: []corev1.Container{
				{
					Name: "train", Image: "gdd.local/demo:v1", ImagePullPolicy: corev1.PullIfNotPresent,
					Command:   []string{"sleep", "86400"},
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
				},
				{
					Name: "logger", Image: "gdd.local/demo:v1", ImagePullPolicy: corev1.PullIfNotPresent,
					Command: []string{"sleep", "86400"},
				},
			},
		},
	}
	if _, err := env.cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	if err := env.runner.WaitPodRunning(ctx, ns, pod.Name); err != nil {
		evs, _ := env.runner.PodEvents(ctx, ns, pod.Name)
		t.Fatalf("%v; events: %s", err, strings.Join(evs, "; "))
	}
	running, err := env.cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim := podClaim(t, ctx, running)

	// The plugin looks the pod up after prepare; until then the container
	// label is empty.
	holder := []string{`namespace="` + ns + `"`, `pod="` + pod.Name + `"`}
	var series []string
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		body, err := env.runner.PluginMetrics(ctx, env.node)
		if err != nil {
			t.Logf("scrape: %v", err)
			return false, nil
		}
		series = holderSeries(body, holder)
		return slices.ContainsFunc(series, func(s string) bool { return strings.Contains(s, `container="train"`) }), nil
	})
	if err != nil {
		t.Fatalf("no reading of pod %s/%s with container=\"train\" in /metrics: %v; its series: %v", ns, pod.Name, err, series)
	}
	containers := map[string]bool{}
	for _, s := range series {
		if !strings.Contains(s, `claim="`+claim.Name+`"`) {
			t.Errorf("series of the pod without its claim %s: %s", claim.Name, s)
		}
		containers[containerOf.FindStringSubmatch(s)[1]] = true
	}
	if len(containers) != 1 {
		t.Errorf("the pod's readings name containers %v, want only train (logger does not use the claim)", containers)
	}
	if !slices.ContainsFunc(series, func(s string) bool { return strings.HasPrefix(s, "gpu_dra_device_memory_total_bytes{") }) {
		t.Errorf("no gpu_dra_device_memory_total_bytes reading for the pod: %v", series)
	}
}

var containerOf = regexp.MustCompile(`container="([^"]*)"`)

// holderSeries returns the device readings in a scrape that carry all the
// holder labels.
func holderSeries(body string, holder []string) []string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "gpu_dra_device_") || !containerOf.MatchString(line) {
			continue
		}
		if !slices.ContainsFunc(holder, func(l string) bool { return !strings.Contains(line, l) }) {
			out = append(out, line)
		}
	}
	return out
}
