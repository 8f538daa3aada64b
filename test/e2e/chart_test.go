package e2e

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/webhook"
)

// chartValueSets are the value combinations the chart must render and the API
// server must accept: the documented ones, ci/*-values.yaml (listed in the
// chart's README; test/chart lints and renders them in make check).
func chartValueSets(t *testing.T) map[string][]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir(), "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values combinations in %s/ci (%v)", chartDir(), err)
	}
	sets := map[string][]string{}
	for _, f := range files {
		sets[strings.TrimSuffix(filepath.Base(f), "-values.yaml")] = []string{"-f", f}
	}
	return sets
}

// TestChart: `helm lint` is clean, and `helm template` output passes a
// server-side dry run on the real API server for every value set. Without
// the admission policies the chart refuses to render unless told that the
// node plugins are then unrestricted on purpose.
func TestChart(t *testing.T) {
	ctx := testContext(t)
	helm(t, ctx, "lint", "--strict", chartDir())
	out, err := exec.CommandContext(ctx, env.helm, "template", "e2e-dry-run", chartDir(), "--set", "validatingAdmissionPolicy.enabled=false").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "acknowledgeUnrestrictedNodePlugins=true") {
		t.Errorf("validatingAdmissionPolicy.enabled=false renders (%v), want a failure naming the acknowledgement:\n%s", err, out)
	}
	for name, values := range chartValueSets(t) {
		t.Run(name, func(t *testing.T) {
			out := helm(t, ctx, append([]string{"template", "e2e-dry-run", chartDir(), "-n", env.namespace}, values...)...)
			cmd := exec.CommandContext(ctx, env.cluster.Kubectl, "--kubeconfig", env.cluster.Kubeconfig,
				"apply", "--dry-run=server", "-f", "-")
			cmd.Stdin = strings.NewReader(out)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if got, err := cmd.Output(); err != nil {
				t.Fatalf("kubectl apply --dry-run=server: %v\n%s\n%s", err, stderr.String(), got)
			}
		})
	}
}

// The chart's webhook configuration is exactly what the controller defines.
func TestChartWebhooks(t *testing.T) {
	ctx := testContext(t)
	out := helm(t, ctx, "template", "rel", chartDir(), "-n", "ns", "--set", "controller.webhook.failurePolicy=Ignore")
	var got *admissionregistrationv1.ValidatingWebhookConfiguration
	for _, doc := range strings.Split(out, "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yamlToObject(doc, obj); err != nil || obj.GetKind() != "ValidatingWebhookConfiguration" {
			continue
		}
		got = &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, got); err != nil {
			t.Fatal(err)
		}
	}
	if got == nil {
		t.Fatal("the chart renders no ValidatingWebhookConfiguration")
	}
	want := webhook.Webhooks(driverName, admissionregistrationv1.WebhookClientConfig{
		Service: &admissionregistrationv1.ServiceReference{Namespace: "ns", Name: "rel-gpu-dra-driver-controller", Path: ptr.To("/validate"), Port: ptr.To[int32](443)},
	}, admissionregistrationv1.Ignore, 10)
	if diff := cmp.Diff(want, got.Webhooks); diff != "" {
		t.Errorf("chart webhooks differ from pkg/controller/webhook.Webhooks (-want +got):\n%s", diff)
	}
}

// The admission policies (ResourceSlices, MPS daemon pods) are bound to the
// service account the plugin really runs as, and their CEL type-checks.
func TestPolicyBoundToPluginServiceAccount(t *testing.T) {
	ctx := testContext(t)
	pod := pluginPod(t, ctx)
	vaps, err := env.cluster.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + env.release,
	})
	// The plugin's slice writes, MPS daemon pods and heartbeat Leases, the
	// controller's channel slice writes, and ComputeDomain status writes.
	if err != nil || len(vaps.Items) != 5 {
		t.Fatalf("want the five ValidatingAdmissionPolicies of release %s: %v %d", env.release, err, len(vaps.Items))
	}
	plugin := "system:serviceaccount:" + pod.Namespace + ":" + pod.Spec.ServiceAccountName
	controller := "system:serviceaccount:" + env.namespace + ":" + controllerDeployment(t, ctx).Spec.Template.Spec.ServiceAccountName
	for _, vap := range vaps.Items {
		users := []string{plugin}
		var exprs []string
		for _, mc := range vap.Spec.MatchConditions {
			exprs = append(exprs, mc.Expression)
		}
		switch {
		case strings.HasSuffix(vap.Name, "-controller-resourceslices"):
			users = []string{controller}
		case strings.HasSuffix(vap.Name, "-computedomain-status"):
			// Every user's status writes: the two accounts are variables.
			users = []string{plugin, controller}
			for _, v := range vap.Spec.Variables {
				exprs = append(exprs, v.Expression)
			}
		}
		for _, user := range users {
			if !slices.ContainsFunc(exprs, func(e string) bool { return strings.Contains(e, `"`+user+`"`) }) {
				t.Errorf("policy %s does not name the user %s: %q", vap.Name, user, exprs)
			}
		}
		if tc := vap.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
			t.Errorf("policy %s type checking warnings: %+v", vap.Name, tc.ExpressionWarnings)
		}
	}
}

func yamlToObject(doc string, obj *unstructured.Unstructured) error {
	return yaml.Unmarshal([]byte(doc), &obj.Object)
}
