// Package servingcert serves a TLS certificate and key from files and
// picks up their renewal (cert-manager, or a kubelet-updated Secret
// volume), over k8s.io/apiserver's dynamiccertificates: the files are
// watched with fsnotify, and a renewal whose certificate and key do not
// match yet (one file written, the other not) keeps the previous pair until
// both are in.
package servingcert

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/klog/v2"
)

// DefaultPollInterval is how often Run looks for the files until they are
// first loaded; from then on they are watched.
const DefaultPollInterval = 10 * time.Second

// Files serves the certificate and key of two PEM files.
type Files struct {
	purpose, certFile, keyFile string
	interval                   time.Duration
	onLoad                     func(*tls.Certificate)

	mu      sync.Mutex // serializes the first load
	content atomic.Pointer[dynamiccertificates.DynamicCertKeyPairContent]
	current atomic.Pointer[tls.Certificate]
	logger  atomic.Pointer[klog.Logger]
}

// NewFiles returns Files for certFile and keyFile; purpose names them in
// logs. interval 0 means DefaultPollInterval. onLoad, when set, is called
// with each certificate loaded (e.g. to export its expiry).
func NewFiles(purpose, certFile, keyFile string, interval time.Duration, onLoad func(*tls.Certificate)) *Files {
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	return &Files{purpose: purpose, certFile: certFile, keyFile: keyFile, interval: interval, onLoad: onLoad}
}

// GetCertificate is tls.Config.GetCertificate: the loaded certificate.
func (f *Files) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := f.current.Load(); c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("no %s certificate loaded from %s yet", f.purpose, f.certFile)
}

// Ready reports whether a certificate is loaded.
func (f *Files) Ready() error {
	if f.current.Load() == nil {
		return fmt.Errorf("%s certificate not loaded from %s yet", f.purpose, f.certFile)
	}
	return nil
}

// Reload reads the files and, when they changed and hold a valid pair,
// serves them. An invalid pair keeps the previous one.
func (f *Files) Reload() (changed bool, err error) {
	c, created, err := f.load()
	if err != nil || created {
		return created, err
	}
	before := f.current.Load()
	if err := c.RunOnce(context.Background()); err != nil {
		return false, fmt.Errorf("load %s and %s: %w", f.certFile, f.keyFile, err)
	}
	return f.current.Load() != before, nil
}

// load returns the dynamic content, made (and its first pair served) on
// the first call whose files hold a valid pair.
func (f *Files) load() (c *dynamiccertificates.DynamicCertKeyPairContent, created bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := f.content.Load(); c != nil {
		return c, false, nil
	}
	c, err = dynamiccertificates.NewDynamicServingContentFromFiles(f.purpose, f.certFile, f.keyFile)
	if err != nil {
		return nil, false, fmt.Errorf("load %s and %s: %w", f.certFile, f.keyFile, err)
	}
	if err := f.serve(c); err != nil {
		return nil, false, err
	}
	c.AddListener(listener{f, c})
	f.content.Store(c)
	return c, true, nil
}

// serve parses c's current pair and serves it.
func (f *Files) serve(c *dynamiccertificates.DynamicCertKeyPairContent) error {
	certPEM, keyPEM := c.CurrentCertKeyContent()
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil { // checked by c already
		return fmt.Errorf("load %s and %s: %w", f.certFile, f.keyFile, err)
	}
	f.current.Store(&pair)
	logger := klog.Background()
	if l := f.logger.Load(); l != nil {
		logger = *l
	}
	logger.Info("Loaded certificate", "purpose", f.purpose, "certFile", f.certFile,
		"notAfter", pair.Leaf.NotAfter, "dnsNames", pair.Leaf.DNSNames)
	if f.onLoad != nil {
		f.onLoad(&pair)
	}
	return nil
}

// listener serves each new pair the dynamic content loads.
type listener struct {
	f *Files
	c *dynamiccertificates.DynamicCertKeyPairContent
}

func (l listener) Enqueue() {
	if err := l.f.serve(l.c); err != nil {
		klog.Background().Error(err, "Serving a renewed certificate failed; keeping the previous one", "purpose", l.f.purpose)
	}
}

// Run loads the files, polling every interval until they hold a valid
// pair, then watches them until ctx is done.
func (f *Files) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	f.logger.Store(&logger)
	ticker := time.NewTicker(f.interval)
	defer ticker.Stop()
	for {
		c, _, err := f.load()
		if err == nil {
			c.Run(ctx, 1)
			return nil
		}
		logger.Error(err, "Loading the certificate failed; retrying", "purpose", f.purpose, "retryIn", f.interval)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}
