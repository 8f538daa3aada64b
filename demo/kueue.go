package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/internal/kueue"
	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
)

// kueuePart shows a team's batch queue with Kueue (internal/kueue): quota over
// whole GPUs, MIG devices by their counters and MPS shares; a job over quota
// waiting with Kueue's reason and admitted once capacity frees; an in-tree
// gang admitted and started whole.
func kueuePart(ctx context.Context, r *scenarios.Runner, opts options) (res outcome) {
	start := time.Now()
	res = outcome{name: "kueue", title: "kueue: a team's ClusterQueue over GPUs, MIG counters and MPS shares; jobs wait and are admitted"}
	defer func() { res.took = time.Since(start) }()
	fmt.Printf("\n=== %s\n", res.title)
	if opts.kueueDir == "" {
		res.err = fmt.Errorf("no -kueue-dir (hack/kueue/build.sh --print-dir; make demo sets it)")
		return res
	}
	out, err := kueue.RunDemo(ctx, r.Cluster, kueue.Demo{
		Dir: opts.kueueDir, StateDir: opts.stateDir, BuildLog: opts.kueueBuildLog, Driver: r.Driver, Image: "gdd.local/demo:v1",
		Timeout: r.Timeout, Logf: r.Logf,
	})
	for _, s := range out.Steps {
		fmt.Printf("  %s: %s waited in the queue while %s held the quota:\n    %s\n", s.Name, s.Waiter, s.Holder, s.Reason)
		fmt.Printf("    admitted after %s finished; quota held: %s %v, %s %v; running: %s\n",
			s.Holder, s.Holder, s.Usage[s.Holder], s.Waiter, s.Usage[s.Waiter], strings.Join(s.WaiterPods, ", "))
	}
	if err != nil {
		res.err = err
		fmt.Fprintf(os.Stderr, "kueue part failed: %v\n", err)
	}
	return res
}
