package telemetry

import (
	"context"
	"crypto/tls"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/servingcert"
)

// filesTLSConfig serves the metrics over HTTPS with the certificate and key
// of two files (the chart's metricsTLSSecret), loaded now and, until ctx is
// done, reloaded when they are renewed. Files that cannot be loaded now are
// an error.
func filesTLSConfig(ctx context.Context, certFile, keyFile string) (*tls.Config, error) {
	files := servingcert.NewFiles("metrics serving", certFile, keyFile, 0, nil)
	if _, err := files.Reload(); err != nil {
		return nil, fmt.Errorf("metrics TLS: %w", err)
	}
	go func() {
		if err := files.Run(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Watching the metrics certificate failed", "certFile", certFile)
		}
	}()
	return &tls.Config{GetCertificate: files.GetCertificate, MinVersion: tls.VersionTLS12}, nil
}
