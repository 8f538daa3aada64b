package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
)

// Helpers of the controller tests that change the release: helm upgrades with
// the values restored afterwards, the controller's Deployment, and admission
// attempts whose outcome the tests classify.

// saveRelease makes the test's cleanup put the release's values back as they
// are now (`helm upgrade --reset-values -f <saved>`), then wait until the
// controller is Ready and its webhook rejects an invalid claim again, so later
// tests find the release as it was.
func saveRelease(t *testing.T, ctx context.Context) {
	t.Helper()
	values := helm(t, ctx, "get", "values", env.release, "-n", env.namespace, "-o", "json")
	if strings.TrimSpace(values) == "null" {
		values = "{}"
	}
	file := filepath.Join(t.TempDir(), "values.json")
	if err := os.WriteFile(file, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		helm(t, ctx, "upgrade", env.release, chartDir(), "-n", env.namespace, "--reset-values", "-f", file, "--wait", "--timeout", "2m")
		waitController(t, ctx)
		waitWebhookRejects(t, ctx)
	})
}

// upgradeRelease runs `helm upgrade --reuse-values` with args and waits until
// the controller's pods are all of the new revision and Ready.
func upgradeRelease(t *testing.T, ctx context.Context, args ...string) {
	t.Helper()
	helm(t, ctx, append([]string{"upgrade", env.release, chartDir(), "-n", env.namespace, "--reuse-values", "--wait", "--timeout", "2m"}, args...)...)
	waitController(t, ctx)
}

// controllerDeployment is the release's dra-controller Deployment.
func controllerDeployment(t *testing.T, ctx context.Context) *appsv1.Deployment {
	t.Helper()
	ds, err := env.cluster.Client.AppsV1().Deployments(env.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=controller,app.kubernetes.io/instance=" + env.release,
	})
	if err != nil || len(ds.Items) != 1 {
		t.Fatalf("want one controller Deployment of release %s: %v (%d)", env.release, err, len(ds.Items))
	}
	return &ds.Items[0]
}

// controllerArg is the value of the controller's command-line flag name.
func controllerArg(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	for _, a := range controllerDeployment(t, ctx).Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	t.Fatalf("the controller has no --%s", name)
	return ""
}

// waitController waits until the controller Deployment has rolled out: every
// replica of the current template Ready, and no pod of an older one left.
func waitController(t *testing.T, ctx context.Context) {
	t.Helper()
	var last string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		d := controllerDeployment(t, ctx)
		pods, err := env.cluster.Client.CoreV1().Pods(env.namespace).List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/component=controller,app.kubernetes.io/instance=" + env.release,
		})
		if err != nil {
			return false, err
		}
		want := *d.Spec.Replicas
		s := d.Status
		last = fmt.Sprintf("generation %d observed %d, replicas %d: updated %d ready %d available %d, %d pods",
			d.Generation, s.ObservedGeneration, want, s.UpdatedReplicas, s.ReadyReplicas, s.AvailableReplicas, len(pods.Items))
		return s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.ReadyReplicas == want &&
			s.AvailableReplicas == want && s.Replicas == want && int32(len(pods.Items)) == want, nil
	})
	if err != nil {
		t.Fatalf("controller not rolled out: %v; %s", err, last)
	}
}

// admissionCase is the case of scenarios.AdmissionCases named name.
func admissionCase(t *testing.T, name string) scenarios.AdmissionCase {
	t.Helper()
	for _, c := range scenarios.AdmissionCases {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no admission case %s", name)
	return scenarios.AdmissionCase{}
}

// caseClaim is the claim of an admission case, in ns.
func caseClaim(t *testing.T, c scenarios.AdmissionCase, ns string) *resourceapi.ResourceClaim {
	t.Helper()
	claim := &resourceapi.ResourceClaim{}
	if err := yaml.UnmarshalStrict([]byte(c.YAML), claim); err != nil {
		t.Fatalf("admission case %s: %v", c.Name, err)
	}
	claim.Namespace = ns
	return claim
}

// invalidCase is the admission case the webhook must reject.
const invalidCase = "mps-150"

// webhookRejects dry-runs the claim of an invalid admission case and returns
// nil when the webhook rejected it with the case's message, else what
// happened instead.
func webhookRejects(ctx context.Context, claim *resourceapi.ResourceClaim, field string) error {
	_, err := env.cluster.Client.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		return fmt.Errorf("invalid claim %s admitted", claim.Name)
	case !strings.Contains(err.Error(), `admission webhook "claims.`+driverName+`" denied the request`) || !strings.Contains(err.Error(), field):
		return fmt.Errorf("invalid claim %s not rejected by the webhook with %q: %w", claim.Name, field, err)
	}
	return nil
}

// waitWebhookRejects waits until the webhook rejects the invalid claim.
func waitWebhookRejects(t *testing.T, ctx context.Context) {
	t.Helper()
	c := admissionCase(t, invalidCase)
	claim := caseClaim(t, c, "default")
	var last error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		last = webhookRejects(ctx, claim, c.Field)
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("the webhook does not work: %v: %v", err, last)
	}
}
