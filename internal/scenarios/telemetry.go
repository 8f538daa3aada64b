package scenarios

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// ScraperName names the ServiceAccount (in the plugin's namespace), the
// ClusterRole and the ClusterRoleBinding with which the runner calls a
// plugin that authenticates its metrics port (--metrics-auth=delegated):
// get /metrics and post /simulate/event.
const ScraperName = "gpu-dra-scenarios-scraper"

// pluginEndpoint is how to reach a plugin's metrics port.
type pluginEndpoint struct {
	pod       *corev1.Pod
	port      int
	delegated bool // --metrics-auth=delegated: HTTPS and a bearer token
	https     bool
}

func (e pluginEndpoint) String() string {
	return fmt.Sprintf("%s/%s:%d", e.pod.Namespace, e.pod.Name, e.port)
}

// pluginEndpoint finds the running kubelet plugin on node and its metrics
// port and auth, from the container's port and flags.
func (r *Runner) pluginEndpoint(ctx context.Context, node string) (pluginEndpoint, error) {
	pod, err := r.PluginPod(ctx, node)
	if err != nil {
		return pluginEndpoint{}, err
	}
	e := pluginEndpoint{pod: pod, port: DefaultMetricsPort}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == "metrics" {
				e.port = int(p.ContainerPort)
			}
		}
		args := append(slices.Clone(c.Command), c.Args...)
		e.delegated = e.delegated || slices.Contains(args, "--metrics-auth=delegated")
		e.https = e.https || e.delegated || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--metrics-tls-cert-file=") })
	}
	return e, nil
}

// pluginDo sends method path?query to the metrics port of the kubelet plugin
// on node and returns the body of a 2xx answer. Without auth it goes through
// the API server's pod proxy. A plugin with --metrics-auth=delegated needs
// the caller's own bearer token, which the pod proxy cannot carry (the API
// server drops the Authorization header once it has authenticated it), so
// the runner dials the pod's IP (reachable from the node, as on the local
// cluster) over HTTPS with a token of ScraperName; the plugin's certificate
// is self-signed, so it is not verified.
func (r *Runner) pluginDo(ctx context.Context, node, method, path string, query url.Values) ([]byte, error) {
	e, err := r.pluginEndpoint(ctx, node)
	if err != nil {
		return nil, err
	}
	if !e.delegated && !e.https {
		req := r.Cluster.Client.CoreV1().RESTClient().Verb(method).Namespace(e.pod.Namespace).Resource("pods").
			Name(fmt.Sprintf("%s:%d", e.pod.Name, e.port)).SubResource("proxy").Suffix(strings.Split(strings.TrimPrefix(path, "/"), "/")...)
		for k, vs := range query {
			for _, v := range vs {
				req = req.Param(k, v)
			}
		}
		body, err := req.DoRaw(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s %s on %s (pod proxy): %w", method, path, e, err)
		}
		return body, nil
	}
	token := ""
	if e.delegated {
		if token, err = r.ScraperToken(ctx, e.pod.Namespace); err != nil {
			return nil, err
		}
	}
	u := url.URL{Scheme: "https", Host: net.JoinHostPort(e.pod.Status.PodIP, strconv.Itoa(e.port)), Path: path, RawQuery: query.Encode()}
	status, body, err := PluginHTTP(ctx, method, u.String(), token)
	if err != nil {
		return nil, fmt.Errorf("%s %s on %s: %w", method, path, e, err)
	}
	if status/100 != 2 {
		return nil, fmt.Errorf("%s %s on %s: HTTP %d: %s", method, path, e, status, strings.TrimSpace(string(body)))
	}
	return body, nil
}

// PluginHTTP sends method url to a plugin's HTTPS metrics port with the
// bearer token (none when empty), without verifying the plugin's
// self-signed certificate, and returns the status and body.
func PluginHTTP(ctx context.Context, method, url, token string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed plugin certificates
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return resp.StatusCode, body, err
}

// ScraperToken returns a short-lived token of the ServiceAccount ScraperName
// in namespace, creating it and its ClusterRole and binding when missing,
// and waits until the API server allows it get /metrics (a plugin caches a
// denial for a while; docs/telemetry.md).
func (r *Runner) ScraperToken(ctx context.Context, namespace string) (string, error) {
	c := r.Cluster.Client
	objects := []func() error{
		func() error {
			_, err := c.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ScraperName}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: ScraperName},
				Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics", "/simulate/event"}, Verbs: []string{"get", "post"}}},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: ScraperName + "-" + namespace},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ScraperName},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: ScraperName, Namespace: namespace}},
			}, metav1.CreateOptions{})
			return err
		},
	}
	for _, create := range objects {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("scraper identity %s in %s: %w", ScraperName, namespace, err)
		}
	}
	user := "system:serviceaccount:" + namespace + ":" + ScraperName
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, r.Timeout, true, func(ctx context.Context) (bool, error) {
		sar, err := c.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:                  user,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
		}}, metav1.CreateOptions{})
		return err == nil && sar.Status.Allowed, nil
	})
	if err != nil {
		return "", fmt.Errorf("%s may not get /metrics after its binding was created: %w", user, err)
	}
	return r.ServiceAccountToken(ctx, namespace, ScraperName)
}

// ServiceAccountToken returns a 10-minute token of the ServiceAccount.
func (r *Runner) ServiceAccountToken(ctx context.Context, namespace, name string) (string, error) {
	tr, err := r.Cluster.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// PluginMetrics returns the Prometheus text the kubelet plugin on node
// serves on /metrics (docs/telemetry.md).
func (r *Runner) PluginMetrics(ctx context.Context, node string) (string, error) {
	body, err := r.pluginDo(ctx, node, http.MethodGet, "/metrics", nil)
	return string(body), err
}
