package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// readTimeout bounds one plugin's reading: the tunnel and the GET.
const readTimeout = 30 * time.Second

// maxMetrics bounds what is read from a plugin.
const maxMetrics = 64 << 20

// portForwarder reads a plugin pod's local metrics port through the API
// server's pods/portforward, as `kubectl port-forward` does: the API
// server authenticates the user and authorizes create on pods/portforward,
// and no credential of the user reaches the plugin.
type portForwarder struct {
	config *rest.Config
	client kubernetes.Interface
}

// ReadMetrics implements kubectlgpu.MetricsReader.
func (f portForwarder) ReadMetrics(ctx context.Context, pod *corev1.Pod, port int) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	url := f.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(f.config)
	if err != nil {
		return nil, fmt.Errorf("port-forward: %w", err)
	}
	spdyDialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	websocketDialer, err := portforward.NewSPDYOverWebsocketDialer(url, f.config)
	if err != nil {
		return nil, fmt.Errorf("port-forward: %w", err)
	}
	dialer := portforward.NewFallbackDialer(websocketDialer, spdyDialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	stop, ready := make(chan struct{}), make(chan struct{})
	var errOut strings.Builder
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, stop, ready, io.Discard, &errOut)
	if err != nil {
		return nil, fmt.Errorf("port-forward: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	defer func() {
		close(stop)
		<-done
	}()
	select {
	case <-ready:
	case err := <-done:
		done <- err // for the deferred wait
		return nil, fmt.Errorf("port-forward to port %d (create pods/portforward in %s): %w", port, pod.Namespace, err)
	case <-ctx.Done():
		return nil, fmt.Errorf("port-forward to port %d: %w", port, ctx.Err())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		return nil, fmt.Errorf("port-forward to port %d: no local port (%v)", port, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0].Local), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics through port-forward: %w %s", err, strings.TrimSpace(errOut.String()))
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxMetrics))
	if err != nil {
		return nil, fmt.Errorf("read /metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: HTTP %d", resp.StatusCode)
	}
	return body, nil
}
