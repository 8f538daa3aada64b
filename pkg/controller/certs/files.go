package certs

import (
	"crypto/tls"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
	"github.com/gpu-dra/gpu-dra-driver/pkg/servingcert"
)

// DefaultFilePollInterval is how often FileSource looks for the files until
// they are first loaded; from then on they are watched.
const DefaultFilePollInterval = servingcert.DefaultPollInterval

// FileSource serves a certificate and key from files, typically a Secret
// that cert-manager issues and renews, mounted into the pod, and reloads
// them when they change (pkg/servingcert; kubelet updates mounted Secrets
// within about a minute). An invalid pair (e.g. the certificate written,
// the key not yet) keeps the previous one. The CA bundle is then
// cert-manager's business (its CA injector annotation on the webhook
// configuration).
type FileSource struct {
	*servingcert.Files
}

// NewFileSource returns a FileSource; interval 0 means
// DefaultFilePollInterval. m may be nil.
func NewFileSource(certFile, keyFile string, interval time.Duration, m *metrics.Metrics) *FileSource {
	m = metrics.OrNew(m)
	return &FileSource{servingcert.NewFiles("webhook serving", certFile, keyFile, interval, func(c *tls.Certificate) {
		m.ServingCertExpiry.Set(float64(c.Leaf.NotAfter.Unix()))
	})}
}

var _ Source = &FileSource{}
