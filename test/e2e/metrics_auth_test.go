package e2e

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
)

// TestMetricsAuth: with the chart's default metricsAuth: delegated, the
// plugin's metrics port answers HTTPS only, refuses a request without a
// token (401) and a token whose ServiceAccount is not bound (403), serves
// /metrics to one bound to the chart's <fullname>-metrics-reader
// ClusterRole, and refuses that reader POST /simulate/event.
func TestMetricsAuth(t *testing.T) {
	ctx := testContext(t)
	c := env.cluster.Client
	pod, err := env.runner.PluginPod(ctx, env.node)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(pod.Spec.Containers[0].Args, " "), "--metrics-auth=delegated") {
		t.Skipf("skipped: the plugin runs without --metrics-auth=delegated (args %v)", pod.Spec.Containers[0].Args)
	}
	readers, err := c.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + env.release})
	if err != nil {
		t.Fatal(err)
	}
	reader := ""
	for _, r := range readers.Items {
		if strings.HasSuffix(r.Name, "-metrics-reader") {
			reader = r.Name
		}
	}
	if reader == "" {
		t.Fatalf("the release %s ships no *-metrics-reader ClusterRole", env.release)
	}

	ns := newNamespace(t, ctx, "e2e-metrics-auth")
	for _, sa := range []string{"prometheus", "stranger"} {
		if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-prometheus"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: ns}},
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	token := map[string]string{}
	for _, sa := range []string{"prometheus", "stranger"} {
		if token[sa], err = env.runner.ServiceAccountToken(ctx, ns, sa); err != nil {
			t.Fatal(err)
		}
	}

	base := "https://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(scenarios.DefaultMetricsPort))
	if status, _, err := scenarios.PluginHTTP(ctx, http.MethodGet, strings.Replace(base, "https:", "http:", 1)+"/metrics", token["prometheus"]); err == nil && status == http.StatusOK {
		t.Error("plain HTTP scrape succeeded")
	}
	for name, tc := range map[string]struct {
		method, path, token string
		want                int
	}{
		"no token":               {http.MethodGet, "/metrics", "", http.StatusUnauthorized},
		"forged token":           {http.MethodGet, "/metrics", "not-a-token", http.StatusUnauthorized},
		"unbound ServiceAccount": {http.MethodGet, "/metrics", token["stranger"], http.StatusForbidden},
		"metrics reader":         {http.MethodGet, "/metrics", token["prometheus"], http.StatusOK},
		"reader injecting event": {http.MethodPost, "/simulate/event?gpu=0&xid=79", token["prometheus"], http.StatusForbidden},
	} {
		t.Run(name, func(t *testing.T) {
			// The binding may reach the API server's authorizer after the
			// first review; the plugin caches a denial for 10 s.
			var status int
			var body []byte
			var reqErr error
			err := poll(ctx, func(ctx context.Context) (bool, error) {
				status, body, reqErr = scenarios.PluginHTTP(ctx, tc.method, base+tc.path, tc.token)
				return reqErr == nil && status == tc.want, nil
			})
			if err != nil {
				t.Fatalf("%s %s: status %d (%v), want %d: %s", tc.method, tc.path, status, reqErr, tc.want, body)
			}
			if got := strings.Contains(string(body), "gpu_dra_plugin_"); got != (tc.want == http.StatusOK) {
				t.Errorf("%s %s: metrics in the answer: %v, want %v", tc.method, tc.path, got, tc.want == http.StatusOK)
			}
		})
	}
}
