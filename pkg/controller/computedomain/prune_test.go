package computedomain

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPruneStaleClaimCache: the claim cache lags behind a pod that came to
// tray-2; the controller reads the claim from the API server before it
// removes tray-2's entry, and keeps it.
func TestPruneStaleClaimCache(t *testing.T) {
	e := newEnv(t, nil, domain("training"))
	e.sync(t, "training")
	e.reserve(t, "training-channel", "tray-1")
	e.report(t, "training", node("tray-1", "Connected"), node("tray-2", "Starting"))
	e.sync(t, "training") // tray-2's clock starts
	e.freezeClaims(t)
	e.reserve(t, "training-channel", "tray-1", "tray-2") // not in the cache
	e.now = e.now.Add(time.Hour)
	e.sync(t, "training")
	if got := nodeNames(e.get(t, "training")); !cmp.Equal(got, []string{"tray-1", "tray-2"}) {
		t.Fatalf("nodes %v, want tray-2's entry kept while the API server's claim has its pod", got)
	}
	// tray-2's pod goes: its entry goes a grace period later, not at once.
	e.reserve(t, "training-channel", "tray-1")
	e.sync(t, "training")
	if got := nodeNames(e.get(t, "training")); len(got) != 2 {
		t.Fatalf("nodes %v, want tray-2's entry kept for the grace period after its pod was seen", got)
	}
	e.now = e.now.Add(time.Minute)
	e.sync(t, "training")
	if got := nodeNames(e.get(t, "training")); !cmp.Equal(got, []string{"tray-1"}) {
		t.Errorf("nodes %v after the grace period, want [tray-1]", got)
	}
}

// TestPruneCachedClaimGone: the cache holds a claim the API server no longer
// has under that UID: nothing is pruned on its word.
func TestPruneCachedClaimGone(t *testing.T) {
	e := newEnv(t, nil, domain("training"))
	e.sync(t, "training")
	e.report(t, "training", node("tray-1", "Connected"))
	e.sync(t, "training")
	e.freezeClaims(t)
	if err := e.client.ResourceV1().ResourceClaims(ns).Delete(e.ctx, "training-channel", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.now = e.now.Add(time.Hour)
	e.sync(t, "training")
	if got := nodeNames(e.get(t, "training")); len(got) != 1 {
		t.Errorf("nodes %v, want tray-1's entry kept while the cached claim is gone from the API server", got)
	}
}
