package liveness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/klog/v2"
)

// Paths the probe server answers; everything else is 404.
const (
	ReadyPath = "/readyz"
	LivePath  = "/livez"
)

// Handler serves ReadyPath and LivePath (and /healthz, the same as
// LivePath), as kube-apiserver serves its own: "ok", or each check's name
// with "ok" or "failed" under ?verbose; the reasons go to the log only.
func (p *Prober) Handler() http.Handler {
	mux := http.NewServeMux()
	live := p.LiveChecks()
	healthz.InstallHandler(mux, live...)
	healthz.InstallLivezHandler(mux, live...)
	healthz.InstallReadyzHandler(mux, p.ReadyChecks()...)
	return mux
}

// Serve serves Handler over plain HTTP at addr until ctx is canceled: the
// kubelet's httpGet probes send no credentials, and the answers reveal no
// more than which checks pass.
func (p *Prober) Serve(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for probes on %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           p.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
	}
	klog.FromContext(ctx).Info("Serving probes", "address", ln.Addr().String(), "paths", []string{ReadyPath, LivePath})
	errCh := make(chan error, 1)
	go func() { errCh <- srv.Serve(ln) }()
	select {
	case err := <-errCh:
		return fmt.Errorf("serve probes: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("stop probe server: %w", err)
	}
	return nil
}
