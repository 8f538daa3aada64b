// Command demo runs the scenarios of demo/specs on a cluster where the gpu.dra.dev
// driver is installed (make demo sets one up): for each scenario it applies the
// objects, waits until every pod is where it should be, prints per pod the node,
// claims, allocated devices and what the container sees (GPU environment, device
// nodes, nvidia-smi -L, MPS pipe directory), checks that the container sees exactly
// its allocated devices, prints the node's allocation summary and deletes the
// scenario's namespace. Before the scenarios it shows the dra-controller (invalid GPU
// configs refused at kubectl apply, GFD labels on the node) and device health (a
// simulated XID taints the GPU in the ResourceSlice, keeps new claims off it, shows in
// the pod status, and goes away after the recovery window); after each scenario it
// checks that kubectl gpu reports the claims' allocations, and at the end it prints
// the kubectl gpu tables with the last scenario still running. Last, with -kueue-dir,
// it runs Kueue and shows a team's batch queue (the kueue part). It exits non-zero if
// any part fails.
//
//	go run ./demo [-specs demo/specs] [-run controller,health,03,04,kueue] [-keep-last] [-kubeconfig FILE] [-kubectl-gpu bin/kubectl-gpu] [-kueue-dir DIR]
package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

func main() {
	specs := flag.String("specs", "demo/specs", "Directory of scenario YAML files.")
	kubeconfig := flag.String("kubeconfig", "", "Kubeconfig (default $KUBECONFIG, else "+scenarios.DefaultKubeconfig+").")
	driver := flag.String("driver", vocabulary.DriverName, "DRA driver name.")
	run := flag.String("run", "", "Comma-separated scenario name prefixes to run (default all), e.g. 03,04.")
	keepLast := flag.Bool("keep-last", false, "Leave the last scenario's objects in place for exploring with kubectl.")
	timeout := flag.Duration("timeout", 3*time.Minute, "Timeout of each wait.")
	kubectlGPU := flag.String("kubectl-gpu", "bin/kubectl-gpu", "kubectl-gpu binary (make build); empty skips the kubectl gpu checks and tables.")
	xid := flag.Int("health-xid", 79, "XID the health part injects.")
	recovery := flag.Duration("health-recovery-timeout", 2*time.Minute, "How long the health part waits for the taint to go (the chart's kubeletPlugin.health.recoveryWindow plus the plugin's 5 s probe).")
	kueueDir := flag.String("kueue-dir", "", "Kueue build (hack/kueue/build.sh --print-dir); empty skips the kueue part unless -run names it.")
	kueueBuildLog := flag.String("kueue-build-log", "", "Log of a hack/kueue/build.sh running in the background: the kueue part waits for it.")
	stateDir := flag.String("state-dir", "/tmp/gdd", "The local cluster's state directory (hack/cluster), where the kueue part keeps Kueue's files.")
	volcano := flag.Bool("volcano", false, "Run the volcano part: Volcano runs beside the cluster (hack/volcano/up.sh).")
	volcanoSkip := flag.String("volcano-skip", "", "Why Volcano could not start: the volcano part prints it and is skipped.")
	flag.Parse()
	opts := options{kubectlGPU: *kubectlGPU, xid: *xid, recovery: *recovery, kueueDir: *kueueDir, kueueBuildLog: *kueueBuildLog, stateDir: *stateDir,
		volcano: *volcano || *volcanoSkip != "", volcanoSkip: *volcanoSkip}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo(ctx, *specs, *kubeconfig, *driver, *run, *keepLast, *timeout, opts); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type options struct {
	kubectlGPU    string
	xid           int
	recovery      time.Duration
	kueueDir      string
	kueueBuildLog string
	stateDir      string
	volcano       bool
	volcanoSkip   string
}

type outcome struct {
	name, title string
	took        time.Duration
	err         error
	problems    []string
}

func demo(ctx context.Context, specs, kubeconfig, driver, run string, keepLast bool, timeout time.Duration, opts options) error {
	all, err := scenarios.Load(specs)
	if err != nil {
		return err
	}
	selected := all[:0:0]
	for _, s := range all {
		if run == "" || matchesAny(s.Name, run) {
			selected = append(selected, s)
		}
	}
	withController, withHealth := run == "" || matchesAny("controller", run), run == "" || matchesAny("health", run)
	withKueue := (run == "" && opts.kueueDir != "") || (run != "" && matchesAny("kueue", run))
	withVolcano := opts.volcano && (run == "" || matchesAny("volcano", run))
	withComputeDomain := run == "" || matchesAny("compute-domain", run)
	if len(selected) == 0 && !withController && !withHealth && !withKueue && !withVolcano && !withComputeDomain {
		return fmt.Errorf("no scenario matches -run=%s", run)
	}
	cluster, err := scenarios.Connect(kubeconfig)
	if err != nil {
		return err
	}
	r := scenarios.NewRunner(cluster)
	r.Driver, r.Timeout = driver, timeout
	r.Logf = func(format string, args ...any) { fmt.Printf("  ... "+format+"\n", args...) }
	if opts.kubectlGPU != "" {
		if _, err := os.Stat(opts.kubectlGPU); err != nil {
			fmt.Printf("(no %s: kubectl gpu checks and tables skipped; make build makes it)\n", opts.kubectlGPU)
		} else {
			r.KubectlGPUPath = opts.kubectlGPU
		}
	}

	nodes, err := waitForSlices(ctx, r)
	if err != nil {
		return err
	}
	fmt.Printf("Driver %s publishes devices on node(s) %s\n", driver, strings.Join(nodes, ", "))
	// The single-node parts run on the first node: the others are cordoned
	// except while a scenario across nodes runs (demo.gpu.dra.dev/fleet).
	others := nodes[1:]
	if len(others) > 0 {
		fmt.Printf("(single-node parts on %s; %s cordoned until the fleet scenarios)\n", nodes[0], strings.Join(others, ", "))
	}
	if err := r.SetUnschedulable(ctx, true, others...); err != nil {
		return err
	}
	defer func() {
		if err := r.SetUnschedulable(context.WithoutCancel(ctx), false, others...); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
		}
	}()

	var results []outcome
	if withController {
		results = append(results, controllerPart(ctx, r, nodes[0]))
	}
	if withHealth {
		results = append(results, healthPart(ctx, r, nodes[0], opts))
	}
	for i, s := range selected {
		if n := s.FleetNodes(); n > len(nodes) {
			fmt.Printf("\n=== %s skipped: it runs across %d nodes, the cluster has %d (GDD_NODES)\n", s.Name, n, len(nodes))
			continue
		} else if n > 0 {
			if err := r.SetUnschedulable(ctx, false, others...); err != nil {
				return err
			}
		}
		res := runScenario(ctx, r, i+1, s)
		results = append(results, res)
		last := i == len(selected)-1
		if last && r.KubectlGPUPath != "" {
			results = append(results, kubectlGPUPart(ctx, r, nodes, s))
		}
		if keepLast && last {
			fmt.Printf("  kept: kubectl get pods,resourceclaims -n %s\n", strings.Join(s.Namespaces(), ","))
			continue
		}
		if err := r.Cleanup(ctx, s); err != nil {
			results[len(results)-1].err = fmt.Errorf("cleanup: %w", err)
			break
		}
		if s.FleetNodes() > 0 {
			if err := r.SetUnschedulable(ctx, true, others...); err != nil {
				return err
			}
		}
	}

	if withVolcano {
		results = append(results, volcanoPart(ctx, r, opts))
	}
	if withComputeDomain {
		results = append(results, computeDomainPart(ctx, r))
	}
	if withKueue {
		results = append(results, kueuePart(ctx, r, opts))
	}

	fmt.Println("\n=== Node allocation summary after the demo")
	for _, n := range nodes {
		gpus, err := r.NodeSummary(ctx, n)
		if err != nil {
			return err
		}
		scenarios.PrintNodeSummary(os.Stdout, n, gpus)
	}

	fmt.Println("\n=== Results")
	failed := 0
	for _, res := range results {
		status := "PASS"
		if res.err != nil || len(res.problems) > 0 {
			status = "FAIL"
			failed++
		}
		fmt.Printf("  %s  %-16s %-70s %5.1fs\n", status, res.name, truncate(res.title, 70), res.took.Seconds())
		if res.err != nil {
			fmt.Printf("        %v\n", res.err)
		}
		for _, p := range res.problems {
			fmt.Printf("        %s\n", p)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d scenarios failed", failed, len(results))
	}
	return nil
}

func runScenario(ctx context.Context, r *scenarios.Runner, n int, s *scenarios.Scenario) outcome {
	start := time.Now()
	res := outcome{name: s.Name, title: s.Title}
	fmt.Printf("\n=== %d. %s (%s)\n", n, s.Title, s.Path)
	for _, l := range strings.Split(s.Description, "\n") {
		if l != "" {
			fmt.Printf("  # %s\n", l)
		}
	}
	defer func() { res.took = time.Since(start) }()
	if err := r.Apply(ctx, s); err != nil {
		res.err = err
		explain(ctx, r, s)
		return res
	}
	if err := r.Wait(ctx, s); err != nil {
		res.err = err
		explain(ctx, r, s)
		return res
	}
	reps, err := r.Inspect(ctx, s)
	if err != nil {
		res.err = err
		return res
	}
	nodes := map[string]bool{}
	for _, rep := range reps {
		scenarios.PrintPod(os.Stdout, rep)
		res.problems = append(res.problems, r.Check(rep)...)
		if rep.Node != "" {
			nodes[rep.Node] = true
		}
	}
	for _, n := range slices.Sorted(maps.Keys(nodes)) {
		gpus, err := r.NodeSummary(ctx, n)
		if err != nil {
			res.err = err
			return res
		}
		scenarios.PrintNodeSummary(os.Stdout, n, gpus)
	}
	if r.KubectlGPUPath != "" {
		problems, err := r.CheckKubectlGPU(ctx)
		if err != nil {
			problems = append(problems, err.Error())
		}
		if len(problems) == 0 {
			fmt.Println("  kubectl gpu nodes -o json and kubectl gpu claims -A -o json match the ResourceClaims' allocations")
		}
		res.problems = append(res.problems, problems...)
		// Pods running simulated loads: each one's own use of its GPU.
		res.problems = append(res.problems, r.ShowTop(ctx, s, os.Stdout)...)
	}
	res.took = time.Since(start)
	return res
}

// controllerPart shows the dra-controller: kubectl apply refuses invalid GPU configs
// with the webhook's message, admits a valid one, and the node carries GFD labels.
func controllerPart(ctx context.Context, r *scenarios.Runner, node string) (res outcome) {
	start := time.Now()
	res = outcome{name: "controller", title: "dra-controller: invalid configs refused at apply, GFD node labels"}
	defer func() { res.took = time.Since(start) }()
	fmt.Printf("\n=== %s\n", res.title)
	fmt.Println("  # The admission webhook decodes and validates our opaque configs with the plugin's code, so a")
	fmt.Println("  # bad claim fails at kubectl apply instead of at prepare, when a pod is already waiting.")
	results, err := r.Admission(ctx)
	if err != nil {
		res.err = err
		return res
	}
	for _, a := range results {
		fmt.Printf("  $ kubectl apply -f claim-%s.yaml   # %s\n", a.Case.Name, a.Case.Title)
		for _, l := range strings.Split(a.Output, "\n") {
			fmt.Printf("    %s\n", l)
		}
		if a.APIError != "" {
			fmt.Printf("    (the API server's message: %s)\n", a.APIError)
		}
		if p := a.Problem(); p != "" {
			res.problems = append(res.problems, p)
		}
	}
	if err := r.CleanupController(ctx); err != nil {
		res.err = err
		return res
	}
	got, want, err := r.WaitGFDLabels(ctx, node)
	fmt.Printf("  node %s labels written by dra-controller from the ResourceSlices (GFD names and values):\n", node)
	for _, l := range scenarios.FormatLabels(got) {
		fmt.Printf("    %s\n", l)
	}
	if err != nil {
		res.problems = append(res.problems, scenarios.LabelDiff(got, want)...)
	}
	return res
}

// healthPart shows a simulated XID taking a GPU out of scheduling and coming back.
func healthPart(ctx context.Context, r *scenarios.Runner, node string, opts options) (res outcome) {
	start := time.Now()
	res = outcome{name: "health", title: fmt.Sprintf("health: a simulated XID %d taints the GPU, the pod status reports it, it recovers", opts.xid)}
	defer func() { res.took = time.Since(start) }()
	fmt.Printf("\n=== %s\n", res.title)
	h, err := r.Health(ctx, node, opts.xid, opts.recovery, os.Stdout)
	if err != nil {
		res.err = err
	} else {
		res.problems = h.Problems()
	}
	if err := r.CleanupHealth(ctx); err != nil && res.err == nil {
		res.err = err
	}
	return res
}

// kubectlGPUPart prints the kubectl gpu tables while scenario s still runs.
func kubectlGPUPart(ctx context.Context, r *scenarios.Runner, nodes []string, s *scenarios.Scenario) (res outcome) {
	start := time.Now()
	res = outcome{name: "kubectl-gpu", title: "kubectl gpu nodes | node | claims -A, with " + s.Name + " running"}
	defer func() { res.took = time.Since(start) }()
	fmt.Printf("\n=== %s\n", res.title)
	cmds := [][]string{{"nodes"}}
	for _, n := range nodes {
		cmds = append(cmds, []string{"node", n})
	}
	cmds = append(cmds, []string{"claims", "-A"})
	for _, args := range cmds {
		fmt.Printf("  $ kubectl gpu %s\n", strings.Join(args, " "))
		out, err := r.KubectlGPU(ctx, args...)
		if err != nil {
			res.problems = append(res.problems, err.Error())
			continue
		}
		for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
			fmt.Printf("    %s\n", l)
		}
	}
	return res
}

// explain prints the pods of a failed scenario with their last events.
func explain(ctx context.Context, r *scenarios.Runner, s *scenarios.Scenario) {
	reps, err := r.Inspect(ctx, s)
	if err != nil {
		return
	}
	for _, rep := range reps {
		scenarios.PrintPod(os.Stdout, rep)
	}
}

// waitForSlices waits until the driver has published devices and returns the nodes.
func waitForSlices(ctx context.Context, r *scenarios.Runner) ([]string, error) {
	deadline := time.Now().Add(r.Timeout)
	for {
		list, err := r.Cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + r.Driver})
		if err == nil && len(list.Items) > 0 {
			nodes := map[string]bool{}
			for _, s := range list.Items {
				if s.Spec.NodeName != nil {
					nodes[*s.Spec.NodeName] = true
				}
			}
			return slices.Sorted(maps.Keys(nodes)), nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no ResourceSlices of driver %s after %s (is the chart installed?): %v", r.Driver, r.Timeout, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func matchesAny(name, prefixes string) bool {
	for _, p := range strings.Split(prefixes, ",") {
		if p = strings.TrimSpace(p); p != "" && strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n-3] + "..."
	}
	return s
}
