package certs

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func writePair(t *testing.T, dir string, names ...string) *keyPair {
	t.Helper()
	ca, err := newCA(time.Now(), time.Hour, "test-ca")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := newServing(ca, time.Now(), time.Hour, names)
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "tls.crt"), pair.certPEM)
	write(t, filepath.Join(dir, "tls.key"), pair.keyPEM)
	return pair
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestFileSource(t *testing.T) {
	dir := t.TempDir()
	f := NewFileSource(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), 0, nil)
	if f.Ready() == nil {
		t.Fatal("ready without files")
	}
	if _, err := f.Reload(); err == nil {
		t.Fatal("no error for missing files")
	}

	first := writePair(t, dir, "a.example")
	if changed, err := f.Reload(); err != nil || !changed {
		t.Fatalf("first load: changed %v, err %v", changed, err)
	}
	if err := f.Ready(); err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Reload(); err != nil || changed {
		t.Fatalf("unchanged files: changed %v, err %v", changed, err)
	}

	// cert-manager renews: a new pair is served.
	second := writePair(t, dir, "b.example")
	if changed, err := f.Reload(); err != nil || !changed {
		t.Fatalf("renewed files: changed %v, err %v", changed, err)
	}
	c, _ := f.GetCertificate(nil)
	if !c.Leaf.Equal(second.cert) || c.Leaf.Equal(first.cert) {
		t.Fatal("renewed certificate not served")
	}

	// Half-written renewal (new cert, old key): keep serving the last pair.
	third := writePair(t, t.TempDir(), "c.example")
	write(t, filepath.Join(dir, "tls.crt"), third.certPEM)
	if _, err := f.Reload(); err == nil {
		t.Fatal("no error for a mismatched pair")
	}
	if c, _ := f.GetCertificate(nil); !c.Leaf.Equal(second.cert) {
		t.Fatal("mismatched pair replaced the served certificate")
	}
}

func TestFileSourceRun(t *testing.T) {
	dir := t.TempDir()
	f := NewFileSource(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), 10*time.Millisecond, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	time.Sleep(30 * time.Millisecond)
	writePair(t, dir, "a.example") // files appear after start
	deadline := time.Now().Add(5 * time.Second)
	for f.Ready() != nil {
		if time.Now().After(deadline) {
			t.Fatal("files not picked up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
