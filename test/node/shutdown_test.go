package node

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/handover"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
)

// A plugin stopped (SIGTERM in a rolling update) while its stale-claim loop
// releases a claim does not hand the node over before that release ended:
// Run returns, and the hand-over lock goes, only after the release's last
// checkpoint save, so the next owner never loads a checkpoint the old one
// rewrites. The release in flight completes: the claim is gone from the
// checkpoint the next owner loads.
func TestShutdownWaitsForStaleRelease(t *testing.T) {
	ctx := context.Background()
	dirs, _, claims, _ := setup(t, map[string]int64{"old": 1})
	old := claims["old"]
	cfg := dirs.Config(machine, nodeName)
	client := apiserver.NodeClient(nodeName, old)
	cfg.KubeClient = client
	cfg.StaleClaimGracePeriod = time.Second
	entered, release := make(chan struct{}), make(chan struct{})
	cfg.FaultHook = func(point string) {
		// Only the stale loop unprepares here: the kubelet never does.
		if point == prepare.FaultUnprepareStarted {
			close(entered)
			<-release
		}
	}
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	if _, err := p.Kubelet.PrepareOne(ctx, old); err != nil {
		t.Fatal(err)
	}
	// The pod and its claim are force-deleted; the kubelet lost its record.
	if err := client.ResourceV1().ResourceClaims(old.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered: // the release marked the claim as going away and goes on
	case <-time.After(30 * time.Second):
		t.Fatal("the stale claim was not released within 30s")
	}

	go func() { stopped <- p.Stop() }()
	// A plugin that does not wait returns at once; give it the time to.
	select {
	case err := <-stopped:
		t.Fatalf("Run returned (%v), handing the node over, while a stale release was in flight", err)
	case <-time.After(2 * time.Second):
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}

	// The next owner takes the lock at once and finds a state it can
	// finish: the release done, or marked as going away (recovery rolls
	// it back), never rewritten under it.
	lockCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lock, err := handover.Acquire(lockCtx, cfg.PluginDataDir, handover.Owner{PodName: "next"}, func(handover.Owner) {})
	if err != nil {
		t.Fatalf("take the hand-over lock after Run returned: %v", err)
	}
	store := checkpoint.NewFileStore(filepath.Join(cfg.PluginDataDir, nodeplugin.CheckpointFile))
	cp, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := cp.Get(old.UID); ok && c.State != checkpoint.UnprepareStarted {
		t.Errorf("the next owner loads the released claim as %s", c.State)
	}
	lock.Release(ctx)
	cfg.FaultHook = nil
	next, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = next.Stop() }()
	if cp, err = store.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if c, ok := cp.Get(old.UID); ok {
		t.Errorf("the next owner keeps the released claim as %s", c.State)
	}
}
