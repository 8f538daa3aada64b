package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"
)

// MetricsPath is where Serve exposes the metrics.
const MetricsPath = "/metrics"

// NewRegistry returns a registry holding the driver's metrics and the
// device collector; either may be nil.
func NewRegistry(driver *DriverMetrics, devices *Collector) metrics.KubeRegistry {
	reg := metrics.NewKubeRegistry()
	if driver != nil {
		driver.MustRegister(reg)
	}
	if devices != nil {
		reg.CustomMustRegister(devices)
	}
	return reg
}

// Handler serves reg in the Prometheus text format. A device that cannot
// be read leaves out its own readings; it never fails the scrape.
func Handler(reg metrics.KubeRegistry) http.Handler {
	return metrics.HandlerFor(reg, metrics.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Server timeouts: a scrape reads a few hundred bytes and writes at most a
// few megabytes; slower or stalled clients are disconnected instead of
// holding connections. Variables for tests.
var (
	readHeaderTimeout = 10 * time.Second
	requestTimeout    = 30 * time.Second
	idleTimeout       = 2 * time.Minute
)

const maxHeaderBytes = 64 << 10

// Serve serves reg on MetricsPath, and the extra handlers on their paths,
// at addr (e.g. ":9400", or "127.0.0.1:9400" for a sidecar that
// authenticates scrapes) until ctx is canceled, then shuts the server down
// gracefully. It returns once the listener failed or the server stopped; a
// failed listen is an error.
func Serve(ctx context.Context, addr string, reg metrics.KubeRegistry, extra map[string]http.Handler) error {
	mux := http.NewServeMux()
	mux.Handle(MetricsPath, Handler(reg))
	for path, h := range extra {
		mux.Handle(path, h)
	}
	srv := newServer(mux)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	klog.FromContext(ctx).Info("Serving metrics", "address", ln.Addr().String(), "path", MetricsPath)
	errCh := make(chan error, 1)
	go func() { errCh <- srv.Serve(ln) }()
	select {
	case err := <-errCh:
		return fmt.Errorf("serve metrics: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("stop metrics server: %w", err)
	}
	return nil
}

func newServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       requestTimeout,
		WriteTimeout:      requestTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
}
