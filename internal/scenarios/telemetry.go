package scenarios

import (
	"context"
	"fmt"

	"k8s.io/client-go/rest"
)

// pluginProxy points req at path on the metrics port of the running kubelet
// plugin on node, through the API server's pod proxy, and returns it with
// the pod and port for messages.
func (r *Runner) pluginProxy(ctx context.Context, node string, req *rest.Request, path ...string) (*rest.Request, string, error) {
	pod, err := r.PluginPod(ctx, node)
	if err != nil {
		return nil, "", err
	}
	port := DefaultMetricsPort
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == "metrics" {
				port = int(p.ContainerPort)
			}
		}
	}
	target := fmt.Sprintf("%s:%d", pod.Name, port)
	req = req.Namespace(pod.Namespace).Resource("pods").Name(target).SubResource("proxy").Suffix(path...)
	return req, pod.Namespace + "/" + target, nil
}

// PluginMetrics returns the Prometheus text the kubelet plugin on node
// serves on /metrics (docs/telemetry.md).
func (r *Runner) PluginMetrics(ctx context.Context, node string) (string, error) {
	req, target, err := r.pluginProxy(ctx, node, r.Cluster.Client.CoreV1().RESTClient().Get(), "metrics")
	if err != nil {
		return "", err
	}
	body, err := req.DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("GET /metrics on %s: %w", target, err)
	}
	return string(body), nil
}
