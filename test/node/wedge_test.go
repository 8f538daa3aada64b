package node

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
)

// A checkpoint save that hangs (POST /simulate/event?hangsave=true) wedges
// every prepare while the DRA socket still answers the empty call its check
// sends and NVML answers: the engine check sees it.
// Within the stall bound and a round the plugin is not ready (naming the
// engine), the heartbeat stops renewing and, after the threshold of
// rounds, liveness fails, so the kubelet restarts the container. Once the
// save goes on, all pass again and nothing is lost: the prepare that was
// wedged completes, and the claim is prepared once, in the checkpoint.
func TestWedgedSaveFailsProbes(t *testing.T) {
	ctx := context.Background()
	const threshold, bound = 3, 2 * time.Second
	p := startProbed(t, func(cfg *nodeplugin.Config) {
		withHeartbeat(cfg)
		cfg.ProbeAddress = freeAddress(t)
		cfg.LivenessFailureThreshold = threshold
		cfg.EngineStallBound = bound
	})
	addr := p.cfg.ProbeAddress
	ready := func() bool { code, _ := probeGet(t, addr, "/readyz"); return code == http.StatusOK }
	live := func() bool { code, _ := probeGet(t, addr, "/livez"); return code == http.StatusOK }
	eventually(t, 10*time.Second, "ready", ready)
	if _, body := probeGet(t, addr, "/readyz"); !strings.Contains(body, "[+]engine ok") {
		t.Fatalf("/readyz has no engine check:\n%s", body)
	}
	p.renewing(t, time.Time{}, "heartbeat Lease created")

	p.hangSaves(t, true)
	type result struct {
		ids []string
		err error
	}
	prepared := make(chan result, 1)
	go func() {
		ids, err := p.Kubelet.PrepareOne(ctx, p.claims["held"])
		prepared <- result{ids, err}
	}()
	start := time.Now()
	took := eventually(t, bound+2*probePeriod+time.Second, "not ready with a save hung", func() bool { return !ready() })
	t.Logf("not ready %v after the save hung", took)
	_, body := probeGet(t, addr, "/readyz")
	if !strings.Contains(body, "[-]engine failed") || !strings.Contains(body, "[+]dra-socket ok") || !strings.Contains(body, "[+]nvml ok") {
		t.Errorf("/readyz with a save hung names the wrong checks:\n%s", body)
	}
	p.quiet(t, "save hung")
	eventually(t, time.Duration(threshold+2)*probePeriod+time.Second, "not live with a save hung", func() bool { return !live() })
	t.Logf("not live %v after the save hung", time.Since(start))
	if _, body := probeGet(t, addr, "/livez"); !strings.Contains(body, "[-]engine failed") {
		t.Errorf("/livez does not name the engine:\n%s", body)
	}

	p.hangSaves(t, false)
	r := <-prepared
	if r.err != nil {
		t.Fatalf("the wedged prepare, once the save went on: %v", r.err)
	}
	eventually(t, 2*probePeriod+time.Second, "ready and live once the save went on", func() bool { return ready() && live() })
	p.renewing(t, p.renewTime(), "renewed once the save went on")
	again, err := p.Kubelet.PrepareOne(ctx, p.claims["held"])
	if err != nil || !sameSet(again, r.ids) {
		t.Errorf("prepare again: %v, %v; want %v", again, err, r.ids)
	}
	cp, err := checkpoint.NewFileStore(filepath.Join(p.cfg.PluginDataDir, nodeplugin.CheckpointFile)).Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := cp.Get(p.claims["held"].UID); !ok || c.State != checkpoint.PrepareCompleted || cp.Len() != 1 {
		t.Errorf("checkpoint after the hang: claim %+v (found %v) of %d, want it alone and completed", c, ok, cp.Len())
	}
}
