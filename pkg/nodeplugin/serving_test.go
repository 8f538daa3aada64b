package nodeplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// registration answers GetInfo like a plugin of an earlier release.
type registration struct {
	registerapi.UnimplementedRegistrationServer
}

func (registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.DRAPlugin, Name: vocabulary.DriverName}, nil
}

// serveRegistration serves GetInfo on path until the returned stop.
func serveRegistration(t *testing.T, path string) (stop func()) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, registration{})
	go func() { _ = srv.Serve(ln) }()
	return srv.Stop
}

// In a rolling update, the instance that has the lock also waits for an
// instance of an earlier release (no lock, the fixed socket name) to stop,
// and then removes the sockets dead instances left, not live ones.
func TestAcquireWaitsForEarlierRelease(t *testing.T) {
	dir, err := os.MkdirTemp("", "acq") // short: unix socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg := &Config{DriverName: vocabulary.DriverName, NodeName: "n1", PodUID: "0b5f2c3e-8d1a-4f6b-9c7e-2a4d6f8b0c1e",
		PluginDataDir: filepath.Join(dir, "data"), RegistrarDir: filepath.Join(dir, "reg")}
	for _, d := range []string{cfg.PluginDataDir, cfg.RegistrarDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	stopLegacy := serveRegistration(t, filepath.Join(cfg.RegistrarDir, cfg.DriverName+"-reg.sock"))
	defer stopLegacy()
	live := filepath.Join(cfg.RegistrarDir, cfg.DriverName+"-live-reg.sock")
	defer serveRegistration(t, live)()
	deadReg := filepath.Join(cfg.RegistrarDir, cfg.DriverName+"-dead-reg.sock")
	deadDRA := filepath.Join(cfg.PluginDataDir, "dra-dead.sock")
	testfs.DeadSocket(t, deadReg)
	testfs.DeadSocket(t, deadDRA)

	s := newServing(nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		lock, err := s.acquire(ctx, cfg)
		defer lock.Release(ctx)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("acquire returned (%v) while an earlier release's instance serves", err)
	case <-time.After(2 * time.Second):
	}
	stopLegacy()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("acquire after the earlier release stopped: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("acquire still waits after the earlier release's instance stopped")
	}
	for path, want := range map[string]bool{live: true, deadReg: false, deadDRA: false} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("%s exists = %v, want %v", path, err == nil, want)
		}
	}
}
