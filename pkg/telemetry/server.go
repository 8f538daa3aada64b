package telemetry

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	certutil "k8s.io/client-go/util/cert"
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

// Security says how the metrics server guards its paths. The zero value
// serves plain HTTP to anyone.
type Security struct {
	// Auth, when set, guards every path (docs/security.md) and implies HTTPS:
	// a bearer token must not cross the network in clear text.
	Auth *Auth
	// CertFile and KeyFile, when set, are the HTTPS serving certificate and
	// key; with Auth and without them, a self-signed certificate is
	// generated at start (scrapers then skip verification, as they do for
	// kubelets' self-signed certificates).
	CertFile, KeyFile string
}

// Serve serves reg on MetricsPath, and the extra handlers on their paths,
// at addr (e.g. ":9400", or "127.0.0.1:9400" for a sidecar that
// authenticates scrapes) until ctx is canceled, then shuts the server down
// gracefully. It returns once the listener failed or the server stopped; a
// failed listen or unusable certificate is an error.
func Serve(ctx context.Context, addr string, reg metrics.KubeRegistry, extra map[string]http.Handler, sec Security) error {
	mux := http.NewServeMux()
	mux.Handle(MetricsPath, Handler(reg))
	for path, h := range extra {
		mux.Handle(path, h)
	}
	var h http.Handler = mux
	if sec.Auth != nil {
		h = sec.Auth.Wrap(mux)
	}
	srv := newServer(h)
	tlsConfig, err := sec.tlsConfig(ctx, addr)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
		ln = tls.NewListener(ln, tlsConfig)
	}
	klog.FromContext(ctx).Info("Serving metrics", "address", ln.Addr().String(), "path", MetricsPath, "scheme", scheme, "authenticated", sec.Auth != nil)
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

// tlsConfig returns the HTTPS configuration sec asks for, nil for plain
// HTTP. Certificate files are reloaded when renewed, until ctx is done.
func (sec Security) tlsConfig(ctx context.Context, addr string) (*tls.Config, error) {
	var pair tls.Certificate
	var err error
	switch {
	case (sec.CertFile == "") != (sec.KeyFile == ""):
		return nil, fmt.Errorf("metrics TLS: give both a certificate file and a key file, or neither (certificate %q, key %q)", sec.CertFile, sec.KeyFile)
	case sec.CertFile != "":
		return filesTLSConfig(ctx, sec.CertFile, sec.KeyFile)
	case sec.Auth != nil:
		if pair, err = selfSignedCert(addr); err != nil {
			return nil, err
		}
	default:
		return nil, nil
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

// selfSignedCert generates a serving certificate for addr's host (the
// host name when addr has none), signed by a CA made for it.
func selfSignedCert(addr string) (tls.Certificate, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("metrics address %q: %w", addr, err)
	}
	if host == "" {
		if host, err = os.Hostname(); err != nil {
			return tls.Certificate{}, fmt.Errorf("metrics TLS: host name for the self-signed certificate: %w", err)
		}
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("metrics TLS: generate a self-signed certificate for %s: %w", host, err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("metrics TLS: self-signed certificate: %w", err)
	}
	return pair, nil
}
