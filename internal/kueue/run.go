package kueue

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
)

// Demo says where Kueue is and where this run keeps its files.
type Demo struct {
	// Dir is hack/kueue/build.sh --print-dir.
	Dir string
	// StateDir is the local cluster's state directory (hack/cluster): the run's
	// files go to <StateDir>/kueue, the manager's PID to <StateDir>/pids/kueue.pid.
	StateDir string
	// BuildLog is the log of a hack/kueue/build.sh running in the background:
	// RunDemo waits for it (WaitBuilt). Empty: Dir must be built.
	BuildLog string
	Driver   string
	Image    string
	Timeout  time.Duration
	Logf     func(format string, args ...any)
}

// Result is what RunDemo showed.
type Result struct {
	Quota Quota
	Costs map[string]Cost
	Steps []Step
}

// RunDemo reads the MIG profiles' costs off the published ResourceSlices,
// starts Kueue with them, runs a team's queue (Team.Run) and removes it all
// again, Kueue last.
func RunDemo(ctx context.Context, c *scenarios.Cluster, d Demo) (res Result, err error) {
	if d.BuildLog != "" {
		if err := WaitBuilt(ctx, d.Dir, d.BuildLog, d.Logf); err != nil {
			return res, err
		}
	}
	list, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + d.Driver})
	if err != nil {
		return res, fmt.Errorf("list ResourceSlices of %s: %w", d.Driver, err)
	}
	if res.Costs, err = ProfileCosts(list.Items, d.Driver); err != nil {
		return res, err
	}
	// A whole GPU's worth of MIG, four GPUs and two MPS shares: enough for
	// one job of each kind, so that the next one waits.
	res.Quota = Quota{GPUs: 4, MIG: Largest(res.Costs), MPSShares: 2}
	d.Logf("MIG profiles cost (compute slices, memory slices) %v; team quota %v", res.Costs, res.Quota.Resources())

	m, err := Start(ctx, c, Options{
		Dir: d.Dir, WorkDir: filepath.Join(d.StateDir, "kueue"), PIDFile: filepath.Join(d.StateDir, "pids", "kueue.pid"),
		WebhookPort: 19443, HealthPort: 18081,
		Transformations: Transformations(res.Costs), MPSClass: MPSClass(d.Driver), Timeout: d.Timeout,
	})
	if err != nil {
		return res, err
	}
	d.Logf("Kueue %s running (host process, log %s)", filepath.Base(d.Dir), m.Log)
	defer func() {
		// A fresh context: cleanup must run after a cancelled one.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*d.Timeout)
		defer cancel()
		err = errors.Join(err, m.Stop(cctx))
	}()
	t := &Team{
		C: c, Driver: d.Driver, Namespace: "demo-kueue", Queue: "team-a", Quota: res.Quota, Costs: res.Costs,
		ShortJob: 30 * time.Second, Image: d.Image, Timeout: d.Timeout, Logf: d.Logf,
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*d.Timeout)
		defer cancel()
		if cerr := t.Cleanup(cctx); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
	}()
	if err := t.Setup(ctx); err != nil {
		return res, err
	}
	res.Steps, err = t.Run(ctx)
	return res, err
}
