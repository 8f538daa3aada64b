package servingcert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	certutil "k8s.io/client-go/util/cert"
)

// writePair writes a new self-signed certificate for host and its key
// into dir and returns the certificate.
func writePair(t *testing.T, dir, host string) *x509.Certificate {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "tls.crt"), certPEM)
	write(t, filepath.Join(dir, "tls.key"), keyPEM)
	certs, err := certutil.ParseCertsPEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return certs[0]
}

// write replaces path the way cert-manager's and the kubelet's writers
// do: a new file renamed over the old one.
func write(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// presented dials addr over TLS and returns the server's certificate.
func presented(t *testing.T, addr string) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test compares the certificate itself
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	return conn.ConnectionState().PeerCertificates[0]
}

// TestFilesServesRenewedPair: a server using GetCertificate presents the
// pair of the files, and after cert-manager renews them (while Run
// watches), the new one, without polling.
func TestFilesServesRenewedPair(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	var loaded []string
	f := NewFiles("test", filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), time.Hour,
		func(c *tls.Certificate) { mu.Lock(); loaded = append(loaded, c.Leaf.DNSNames[0]); mu.Unlock() })
	first := writePair(t, dir, "first.example")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: f.GetCertificate, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = conn.(*tls.Conn).Handshake(); _ = conn.Close() }()
		}
	}()
	waitFor(t, func() bool { return f.Ready() == nil })
	if got := presented(t, ln.Addr().String()); !got.Equal(first) {
		t.Fatalf("presents %s, want the files' first certificate", got.Subject.CommonName)
	}

	// The polling interval is an hour: only the watch can see this.
	second := writePair(t, dir, "second.example")
	waitFor(t, func() bool { return presented(t, ln.Addr().String()).Equal(second) })
	// onLoad runs after the pair is served, so it may come a moment later.
	last := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(loaded) }
	waitFor(t, func() bool { l := last(); return len(l) >= 2 && l[len(l)-1] == "second.example" })
	if l := last(); l[0] != "first.example" {
		t.Errorf("onLoad saw %v", l)
	}
}

// TestFilesReload: Reload loads the files, reports changes only, and keeps
// the previous pair when the files do not hold a valid one.
func TestFilesReload(t *testing.T) {
	dir := t.TempDir()
	f := NewFiles("test", filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), 0, nil)
	if _, err := f.Reload(); err == nil {
		t.Fatal("no error for missing files")
	}
	if f.Ready() == nil {
		t.Fatal("ready without files")
	}
	first := writePair(t, dir, "a.example")
	if changed, err := f.Reload(); err != nil || !changed {
		t.Fatalf("first load: changed %v, err %v", changed, err)
	}
	if changed, err := f.Reload(); err != nil || changed {
		t.Fatalf("unchanged files: changed %v, err %v", changed, err)
	}
	other := t.TempDir()
	writePair(t, other, "b.example")
	key, err := os.ReadFile(filepath.Join(other, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "tls.key"), key) // the key renewed, the certificate not yet
	if _, err := f.Reload(); err == nil {
		t.Fatal("no error for a mismatched pair")
	}
	if c, _ := f.GetCertificate(nil); !c.Leaf.Equal(first) {
		t.Fatal("a mismatched pair replaced the served certificate")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
