package node

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
)

// probeGet returns the status and body of GET path?verbose on the probe address.
func probeGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path + "?verbose")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// The plugin's probes as the kubelet sees them: healthy while its sockets
// and NVML answer; a hung NVML (POST /simulate/event?hang=true) fails
// readiness within a round and liveness only after the threshold of
// consecutive rounds, and both pass again once NVML answers; a DRA socket
// that no longer answers fails them too. A claim prepared before the hang
// is still prepared after it.
func TestProbes(t *testing.T) {
	ctx := context.Background()
	const period, threshold = probePeriod, 3
	p := startProbed(t, func(cfg *nodeplugin.Config) {
		cfg.ProbeAddress = freeAddress(t)
		cfg.LivenessFailureThreshold = threshold
	})
	cfg, claims := p.cfg, p.claims
	before, err := p.Kubelet.PrepareOne(ctx, claims["held"])
	if err != nil {
		t.Fatal(err)
	}

	ready := func() bool { code, _ := probeGet(t, cfg.ProbeAddress, "/readyz"); return code == http.StatusOK }
	live := func() bool { code, _ := probeGet(t, cfg.ProbeAddress, "/livez"); return code == http.StatusOK }
	eventually(t, 10*time.Second, "ready", ready)
	for _, want := range []string{"[+]dra-socket ok", "[+]registration-socket ok", "[+]nvml ok"} {
		if _, body := probeGet(t, cfg.ProbeAddress, "/readyz"); !strings.Contains(body, want) {
			t.Errorf("/readyz lacks %q:\n%s", want, body)
		}
	}
	if !live() {
		t.Fatal("not live while healthy")
	}

	p.hang(t, true)
	start := time.Now()
	took := eventually(t, 2*period+time.Second, "not ready with NVML hung", func() bool { return !ready() })
	_, body := probeGet(t, cfg.ProbeAddress, "/readyz")
	if !strings.Contains(body, "[-]nvml failed") || !strings.Contains(body, "[+]registration-socket ok") {
		t.Errorf("/readyz with NVML hung names the wrong checks:\n%s", body)
	}
	if strings.Contains(body, "DeviceGetCount") || strings.Contains(body, "no answer") {
		t.Errorf("/readyz reveals a reason:\n%s", body)
	}
	t.Logf("not ready %v after the hang", took)
	if !live() && time.Since(start) < time.Duration(threshold-1)*period {
		t.Errorf("liveness failed %v after the hang, before %d rounds", time.Since(start), threshold)
	}
	eventually(t, time.Duration(threshold+2)*period+time.Second, "not live with NVML hung", func() bool { return !live() })
	if took = time.Since(start); took < time.Duration(threshold-1)*period {
		t.Errorf("liveness failed %v after the hang, before %d rounds of %v", took, threshold, period)
	}
	t.Logf("not live %v after the hang", took)
	if _, body := probeGet(t, cfg.ProbeAddress, "/livez"); !strings.Contains(body, "[-]nvml failed") {
		t.Errorf("/livez does not name nvml:\n%s", body)
	}

	p.hang(t, false)
	eventually(t, 2*period+time.Second, "ready after release", func() bool { return ready() && live() })
	after, err := p.Kubelet.PrepareOne(ctx, claims["held"])
	if err != nil {
		t.Fatalf("prepare the held claim again after the hang: %v", err)
	}
	if !sameSet(before, after) {
		t.Errorf("the held claim's devices changed over the hang: %v, then %v", before, after)
	}

	// A DRA socket the kubelet can no longer reach fails the probes.
	if err := os.Remove(filepath.Join(cfg.PluginDataDir, "dra.sock")); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*period+time.Second, "not ready without the DRA socket", func() bool { return !ready() })
	if _, body := probeGet(t, cfg.ProbeAddress, "/readyz"); !strings.Contains(body, "[-]dra-socket failed") || !strings.Contains(body, "[+]nvml ok") {
		t.Errorf("/readyz without the DRA socket:\n%s", body)
	}
	eventually(t, time.Duration(threshold+2)*period+time.Second, "not live without the DRA socket", func() bool { return !live() })
}
