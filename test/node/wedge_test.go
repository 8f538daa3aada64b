package node

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
)

// A wedged engine: a checkpoint save that hangs (POST
// /simulate/event?hangsave=true), or a step that hangs under a GPU's lock
// (an NVML call on that GPU: a FaultHook that blocks), wedges the prepare
// while the DRA socket still answers the empty call its check sends and
// NVML answers DeviceGetCount: the engine check sees it. Within the stall
// bound and a round the plugin is not ready (naming the engine), the
// heartbeat stops renewing and, after the threshold of rounds, liveness
// fails, so the kubelet restarts the container. Once the wedge goes, all
// pass again and nothing is lost: the prepare that was wedged completes,
// and the claim is prepared once, in the checkpoint.
func TestWedgedEngineFailsProbes(t *testing.T) {
	for name, at := range map[string]string{"save": "", "GPU lock": prepare.FaultPrepareStarted} {
		t.Run(name, func(t *testing.T) { testWedgedEngine(t, at) })
	}
}

// testWedgedEngine wedges the engine with hangsave, or at fault point at.
func testWedgedEngine(t *testing.T, at string) {
	ctx := context.Background()
	const threshold, bound = 3, 2 * time.Second
	release := make(chan struct{})
	var once sync.Once
	unwedge := func() { once.Do(func() { close(release) }) }
	p := startProbed(t, func(cfg *nodeplugin.Config) {
		withHeartbeat(cfg)
		cfg.ProbeAddress = freeAddress(t)
		cfg.LivenessFailureThreshold = threshold
		cfg.EngineStallBound = bound
		cfg.FaultHook = func(point string) {
			if at != "" && point == at {
				<-release
			}
		}
	})
	t.Cleanup(unwedge) // before the plugin stops, which drains the prepare
	wedge := func(on bool) {
		if at == "" {
			p.hangSaves(t, on)
		} else if !on {
			unwedge()
		}
	}
	addr := p.cfg.ProbeAddress
	ready := func() bool { code, _ := probeGet(t, addr, "/readyz"); return code == http.StatusOK }
	live := func() bool { code, _ := probeGet(t, addr, "/livez"); return code == http.StatusOK }
	eventually(t, 10*time.Second, "ready", ready)
	if _, body := probeGet(t, addr, "/readyz"); !strings.Contains(body, "[+]engine ok") {
		t.Fatalf("/readyz has no engine check:\n%s", body)
	}
	p.renewing(t, time.Time{}, "heartbeat Lease created")

	wedge(true)
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
	took := eventually(t, bound+2*probePeriod+time.Second, "not ready with the engine wedged", func() bool { return !ready() })
	t.Logf("not ready %v after the wedge", took)
	_, body := probeGet(t, addr, "/readyz")
	if !strings.Contains(body, "[-]engine failed") || !strings.Contains(body, "[+]dra-socket ok") || !strings.Contains(body, "[+]nvml ok") {
		t.Errorf("/readyz with the engine wedged names the wrong checks:\n%s", body)
	}
	p.quiet(t, "engine wedged")
	eventually(t, time.Duration(threshold+2)*probePeriod+time.Second, "not live with the engine wedged", func() bool { return !live() })
	t.Logf("not live %v after the wedge", time.Since(start))
	if _, body := probeGet(t, addr, "/livez"); !strings.Contains(body, "[-]engine failed") {
		t.Errorf("/livez does not name the engine:\n%s", body)
	}

	wedge(false)
	r := <-prepared
	if r.err != nil {
		t.Fatalf("the wedged prepare, once unwedged: %v", r.err)
	}
	eventually(t, 2*probePeriod+time.Second, "ready and live once unwedged", func() bool { return ready() && live() })
	p.renewing(t, p.renewTime(), "renewed once unwedged")
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
