package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
)

// DefaultFilePollInterval is how often FileSource looks for new files.
const DefaultFilePollInterval = 10 * time.Second

// FileSource serves a certificate and key from files, typically a Secret
// that cert-manager issues and renews, mounted into the pod. It reloads them
// when their contents change (kubelet updates mounted Secrets within about
// a minute). The CA bundle is then cert-manager's business (its CA injector
// annotation on the webhook configuration).
type FileSource struct {
	certFile, keyFile string
	interval          time.Duration
	metrics           *metrics.Metrics

	current atomic.Pointer[tls.Certificate]
	mu      sync.Mutex // serializes reload
	last    []byte     // cert and key file contents of the current certificate
}

// NewFileSource returns a FileSource; interval 0 means
// DefaultFilePollInterval. m may be nil.
func NewFileSource(certFile, keyFile string, interval time.Duration, m *metrics.Metrics) *FileSource {
	if interval <= 0 {
		interval = DefaultFilePollInterval
	}
	return &FileSource{certFile: certFile, keyFile: keyFile, interval: interval, metrics: metrics.OrNew(m)}
}

// GetCertificate returns the loaded certificate.
func (f *FileSource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := f.current.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("no serving certificate loaded yet")
}

// Ready reports whether a certificate is loaded.
func (f *FileSource) Ready() error {
	if f.current.Load() == nil {
		return fmt.Errorf("serving certificate not loaded from %s yet", f.certFile)
	}
	return nil
}

// Reload reads the files and, when they changed and hold a valid pair,
// serves them. An invalid pair (e.g. the certificate written, the key not
// yet) keeps the previous one.
func (f *FileSource) Reload() (changed bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	certPEM, err := os.ReadFile(f.certFile)
	if err != nil {
		return false, fmt.Errorf("read certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(f.keyFile)
	if err != nil {
		return false, fmt.Errorf("read key: %w", err)
	}
	both := append(append([]byte{}, certPEM...), keyPEM...)
	if f.last != nil && bytes.Equal(both, f.last) {
		return false, nil
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, fmt.Errorf("load %s and %s: %w", f.certFile, f.keyFile, err)
	}
	f.current.Store(&c)
	f.last = both
	f.metrics.ServingCertExpiry.Set(float64(c.Leaf.NotAfter.Unix()))
	return true, nil
}

// Run polls the files until ctx is done.
func (f *FileSource) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	ticker := time.NewTicker(f.interval)
	defer ticker.Stop()
	for {
		changed, err := f.Reload()
		switch {
		case err != nil:
			logger.Error(err, "Loading the serving certificate failed; keeping the previous one", "certFile", f.certFile)
		case changed:
			c := f.current.Load()
			logger.Info("Loaded serving certificate", "certFile", f.certFile, "notAfter", c.Leaf.NotAfter, "dnsNames", c.Leaf.DNSNames)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

var _ Source = &FileSource{}
