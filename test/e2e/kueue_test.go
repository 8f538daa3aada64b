package e2e

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/internal/kueue"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// TestKueueTeamQueue runs Kueue (built from its Go module by hack/kueue/build.sh)
// with a team's ClusterQueue over whole GPUs, MIG devices charged by the
// counters their profile consumes, and MPS shares. In each part a job over
// quota waits in the queue, suspended with no pod, with Kueue's "insufficient unused
// quota" reason, and is admitted when the job holding the quota finishes; the
// GPU part's waiter is an in-tree gang (PodGroup minCount 3) whose three pods
// all start together.
func TestKueueTeamQueue(t *testing.T) {
	dir := os.Getenv("E2E_KUEUE_DIR")
	if dir == "" {
		t.Skip("E2E_KUEUE_DIR is not set: make e2e sets it to hack/kueue/build.sh --print-dir")
	}
	// make e2e builds Kueue in the background (E2E_KUEUE_BUILD_LOG): a cold
	// build takes 10-30 minutes on 2 cores.
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	res, err := kueue.RunDemo(ctx, env.cluster, kueue.Demo{
		Dir: dir, StateDir: getenv("E2E_STATE_DIR", "/tmp/gdd"), BuildLog: os.Getenv("E2E_KUEUE_BUILD_LOG"), Driver: driverName,
		Image: "gdd.local/demo:v1", Timeout: 3 * time.Minute, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	steps := map[string]kueue.Step{}
	for _, s := range res.Steps {
		steps[s.Name] = s
	}
	for name, want := range map[string][]string{
		"gpus+gang": {"nvidia.com/gpu"},
		"mig":       {kueue.ResourceComputeSlices, kueue.ResourceMemorySlices},
		"mps":       {kueue.ResourceMPSShares},
	} {
		s, ok := steps[name]
		if !ok {
			t.Errorf("no %s step in %+v", name, res.Steps)
			continue
		}
		if !kueue.WaitsFor(s.Reason, want...) {
			t.Errorf("%s: %s waited with %q, want insufficient unused quota for one of %v", name, s.Waiter, s.Reason, want)
		}
		if s.Usage[s.Holder] == nil || s.Usage[s.Waiter] == nil {
			t.Errorf("%s: usage %v lacks %s or %s", name, s.Usage, s.Holder, s.Waiter)
		}
	}

	// The gang is admitted whole: three pods' GPUs at once, all running.
	g := steps["gpus+gang"]
	if got := g.Usage[g.Waiter]["nvidia.com/gpu"]; got != 3 {
		t.Errorf("gang %s holds %d nvidia.com/gpu, want 3 (its three pods at once)", g.Waiter, got)
	}
	if len(g.WaiterPods) != 3 {
		t.Errorf("gang pods running: %v, want 3", g.WaiterPods)
	}

	// A 7g MIG device costs its counters: seven times a 1g one's compute slices.
	m := steps["mig"]
	small, big := m.Usage[m.Holder], m.Usage[m.Waiter]
	for _, r := range []string{kueue.ResourceComputeSlices, kueue.ResourceMemorySlices} {
		if small[r] <= 0 || big[r] <= small[r] {
			t.Errorf("MIG usage of %s: %s holds %d, %s holds %d; want the big profile dearer", r, m.Holder, small[r], m.Waiter, big[r])
		}
	}
	if want := kueue.Largest(res.Costs); big[kueue.ResourceComputeSlices] != want.ComputeSlices || big[kueue.ResourceMemorySlices] != want.MemorySlices {
		t.Errorf("%s holds %v, want the published counters of its profile %+v", m.Waiter, big, want)
	}
	for r := range big {
		if strings.HasPrefix(r, vocabulary.ResourceMIGPrefix) {
			t.Errorf("%s holds the device-plugin name %s itself (%v): the transformation did not replace it", m.Waiter, r, big)
		}
	}

	// MPS shares are counted per claim of the MPS class.
	p := steps["mps"]
	if got := p.Usage[p.Holder][kueue.ResourceMPSShares]; got != res.Quota.MPSShares {
		t.Errorf("%s holds %d MPS shares, want %d (one per pod's claim)", p.Holder, got, res.Quota.MPSShares)
	}
}
