package telemetry

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// TestServeReloadsRenewedCertificate: the metrics server presents the
// certificate of its files and, once they are renewed (a new
// metricsTLSSecret), the new one without a restart; files that cannot be
// loaded fail Serve at start.
func TestServeReloadsRenewedCertificate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	sec := Security{CertFile: certFile, KeyFile: keyFile}
	if err := Serve(context.Background(), "127.0.0.1:0", NewRegistry(nil, nil), nil, sec); err == nil {
		t.Fatal("Serve without the certificate files: no error")
	}
	renew := func(host string) {
		certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		for path, data := range map[string][]byte{certFile: certPEM, keyFile: keyPEM} {
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	renew("first.example")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // Serve listens itself
	ctx, cancel := context.WithCancel(context.Background())
	errCh := make(chan error, 1)
	go func() { errCh <- Serve(ctx, addr, NewRegistry(nil, nil), nil, sec) }()
	defer func() {
		cancel()
		if err := <-errCh; err != nil {
			t.Error(err)
		}
	}()
	presents := func(host string) bool {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test checks the certificate itself
		if err != nil {
			return false
		}
		defer func() { _ = conn.Close() }()
		names := conn.ConnectionState().PeerCertificates[0].DNSNames
		return len(names) > 0 && names[0] == host
	}
	for _, host := range []string{"first.example", "second.example"} {
		if host != "first.example" {
			renew(host)
		}
		deadline := time.Now().Add(10 * time.Second)
		for !presents(host) {
			if time.Now().After(deadline) {
				t.Fatalf("the metrics server does not present the certificate for %s", host)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
