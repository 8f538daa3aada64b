package e2e

import (
	"context"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry/dcgm"
)

// promExpectation is what an expression must return while the demo
// workloads run: series, and where they carry a pod label, at least pods.
type promExpectation struct {
	expr   string
	source string
	pods   []string // namespace/pod
	// check, if set, judges the result (nil: fine).
	check func([]promSeries) error
	// absent explains why the simulation cannot give the expression
	// series; it is then only evaluated.
	absent string
}

// TestPrometheusDashboards runs a real Prometheus that scrapes the kubelet
// plugin (HTTPS, a ServiceAccount token, as docs/telemetry.md says) with the
// dcgm-compatible exposition on, while the demo's two time-sliced load pods
// (10-gpu-top) and two MIG pods (04-mig) run, and evaluates through its
// HTTP API every PromQL expression of the shipped Grafana dashboard, every
// ```promql example of docs/telemetry.md and typical dcgm-exporter
// dashboard queries: each returns series, with the demo pods' labels where
// it keeps pod labels, and the dcgm ones each pod's own use.
func TestPrometheusDashboards(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	t.Cleanup(cancel)
	r := env.runner

	old := pluginPod(t, ctx)
	saveRelease(t, ctx)
	// The plugin rolls: its timeout (the last --timeout wins).
	upgradeRelease(t, ctx, "--set", "kubeletPlugin.dcgmMetrics=true", "--timeout", "3m")
	waitNewPluginPod(t, ctx, old.UID)
	plugin := pluginPod(t, ctx)
	port := scenarios.DefaultMetricsPort
	for _, c := range plugin.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == "metrics" {
				port = int(p.ContainerPort)
			}
		}
	}
	token, err := r.ScraperToken(ctx, env.namespace)
	if err != nil {
		t.Fatal(err)
	}
	prom := startPrometheus(t, net.JoinHostPort(plugin.Status.PodIP, strconv.Itoa(port)), token)

	// One claim prepared and unprepared before: the unprepare latency panels.
	first := startDemoSpec(t, ctx, "01-first-gpu.yaml")
	if err := r.Cleanup(ctx, first); err != nil {
		t.Fatal(err)
	}

	var loads []scenarios.GPULoad
	var migPods []string
	for _, spec := range []string{"10-gpu-top.yaml", "04-mig.yaml"} {
		s := startDemoSpec(t, ctx, spec)
		if spec == "10-gpu-top.yaml" {
			loads = scenarios.Loads(s)
		} else {
			for _, o := range s.Objects {
				if o.GetKind() == "Pod" {
					migPods = append(migPods, o.GetNamespace()+"/"+o.GetName())
				}
			}
		}
	}
	if len(loads) != 2 || len(migPods) == 0 {
		t.Fatalf("loads %+v, MIG pods %v: want two loads and MIG pods", loads, migPods)
	}
	var loadPods []string
	for _, l := range loads {
		loadPods = append(loadPods, l.Namespace+"/"+l.Pod)
	}

	// A critical XID on a GPU nobody uses: the dashboard's health panels
	// and DCGM_FI_DEV_XID_ERRORS then have something to show.
	const xid = 62
	injectXID(t, ctx, prom, xid)

	var exps []promExpectation
	vars := strings.NewReplacer(`$node`, env.node, `$namespace`, ".*", `$pod`, ".*", `$__rate_interval`, "1m")
	for _, e := range dashboardExpressions(t, filepath.Join(chartDir(), "dashboards", "gpu-dra-dashboard.json")) {
		x := promExpectation{expr: vars.Replace(e), source: "dashboard", pods: loadPods}
		switch {
		case strings.Contains(e, "nvlink"):
			x.absent = "the simulation has no NVLink (docs/telemetry.md, Simulation)"
		case strings.Contains(e, "gpu_dra_plugin_errors_total"):
			x.absent = "the counter has no series before the plugin's first error, and the demo makes none"
		}
		exps = append(exps, x)
	}
	for _, e := range docExpressions(t, filepath.Join(env.repoRoot, "docs", "telemetry.md")) {
		x := promExpectation{expr: e, source: "docs/telemetry.md", pods: loadPods}
		if strings.Contains(e, "GPU_I_ID") {
			x.pods = migPods
		}
		if strings.Contains(e, "NVLINK") {
			x.absent = "the simulation has no NVLink"
		}
		exps = append(exps, x)
	}
	// Typical dcgm-exporter dashboard queries, and each pod's own use.
	const mib = 1 << 20
	own := func(metric string, want func(scenarios.GPULoad) float64, tolerance float64) func([]promSeries) error {
		return func(res []promSeries) error {
			for _, l := range loads {
				i := slices.IndexFunc(res, func(s promSeries) bool {
					return s.Metric[dcgm.LabelNamespace] == l.Namespace && s.Metric[dcgm.LabelPod] == l.Pod
				})
				if i < 0 {
					return fmt.Errorf("no %s series of %s/%s", metric, l.Namespace, l.Pod)
				}
				if got := res[i].Value; math.Abs(got-want(l)) > tolerance {
					return fmt.Errorf("%s of %s/%s = %v, want its own %v", metric, l.Namespace, l.Pod, got, want(l))
				}
			}
			return nil
		}
	}
	exps = append(exps,
		promExpectation{expr: dcgm.GPUUtil + `{pod!=""}`, pods: loadPods,
			check: own(dcgm.GPUUtil, func(l scenarios.GPULoad) float64 { return l.SMPercent }, topTolerance)},
		promExpectation{expr: dcgm.FBUsed + `{pod!=""}`, pods: loadPods,
			check: own(dcgm.FBUsed, func(l scenarios.GPULoad) float64 { return float64(l.MemoryBytes) / mib }, 0)},
		promExpectation{expr: `avg by (Hostname, gpu) (` + dcgm.GPUUtil + `)`},
		promExpectation{expr: `sum by (namespace, pod) (` + dcgm.FBUsed + `{pod!=""})`, pods: append(slices.Clone(loadPods), migPods...)},
		promExpectation{expr: dcgm.FBFree + `{GPU_I_ID!="", pod!=""}`, pods: migPods},
		promExpectation{expr: dcgm.GREngineActive + `{GPU_I_ID!="", pod!=""}`, pods: migPods},
		promExpectation{expr: dcgm.GPUTemp},
		promExpectation{expr: dcgm.PowerUsage},
		promExpectation{expr: dcgm.SMClock},
		promExpectation{expr: dcgm.MemClock},
		promExpectation{expr: `rate(` + dcgm.TotalEnergy + `[1m])`},
		promExpectation{expr: dcgm.XIDErrors + ` == ` + strconv.Itoa(xid)},
	)
	for i := range exps {
		if exps[i].source == "" {
			exps[i].source = "dcgm dashboard"
		}
	}

	// Each expression must be satisfied at some point while the workloads
	// run (rates need two scrapes; the injected XID's unhealthy GPU recovers
	// after the recovery window).
	pending := map[int]string{}
	for i := range exps {
		pending[i] = "not evaluated"
	}
	deadline := time.Now().Add(3 * time.Minute)
	for len(pending) > 0 && time.Now().Before(deadline) {
		for i := range pending {
			x := exps[i]
			res, err := prom.query(ctx, x.expr)
			switch {
			case err != nil:
				pending[i] = err.Error()
			case x.absent != "":
				t.Logf("%s: %s: evaluated; no series expected: %s", x.source, x.expr, x.absent)
				delete(pending, i)
			default:
				if problem := judge(x, res); problem != "" {
					pending[i] = problem
				} else {
					delete(pending, i)
				}
			}
		}
		if len(pending) > 0 {
			time.Sleep(2 * time.Second)
		}
	}
	for i, problem := range pending {
		t.Errorf("%s: %s: %s", exps[i].source, exps[i].expr, problem)
	}
	t.Logf("%d expressions evaluated against Prometheus scraping %s", len(exps), plugin.Name)
}

// judge returns what is wrong with res for x; "" when nothing is.
func judge(x promExpectation, res []promSeries) string {
	if len(res) == 0 {
		return "no series"
	}
	withPod := slices.ContainsFunc(res, func(s promSeries) bool { _, ok := s.Metric["pod"]; return ok })
	if withPod {
		for _, want := range x.pods {
			ns, pod, _ := strings.Cut(want, "/")
			if !slices.ContainsFunc(res, func(s promSeries) bool {
				return s.Metric["pod"] == pod && (s.Metric["namespace"] == ns || s.Metric["namespace"] == "")
			}) {
				return fmt.Sprintf("no series of pod %s in %d series", want, len(res))
			}
		}
	}
	if x.check != nil {
		if err := x.check(res); err != nil {
			return err.Error()
		}
	}
	return ""
}

// injectXID injects a critical XID into a GPU no claim holds and that has no
// MIG devices, and waits until Prometheus has scraped it.
func injectXID(t *testing.T, ctx context.Context, prom *prometheus, xid int) {
	t.Helper()
	// The native gpu label (gpu-N) of every GPU with a holder or MIG devices.
	usedNames := map[string]bool{}
	held, err := prom.query(ctx, `gpu_dra_device_memory_total_bytes{pod!=""} or gpu_dra_device_memory_total_bytes{uuid=~"MIG-.*"}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range held {
		usedNames[s.Metric["gpu"]] = true
	}
	info, err := prom.query(ctx, `gpu_dra_device_info{uuid=~"GPU-.*"}`)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, s := range info {
		used[s.Metric["uuid"]] = usedNames[s.Metric["gpu"]]
	}
	// dcgm's gpu label is NVML's index, which /simulate/event takes.
	gpus, err := prom.query(ctx, dcgm.GPUTemp)
	if err != nil {
		t.Fatal(err)
	}
	index := -1
	for _, s := range gpus {
		if used[s.Metric[dcgm.LabelUUID]] {
			continue
		}
		if i, err := strconv.Atoi(s.Metric[dcgm.LabelGPU]); err == nil && i > index {
			index = i
		}
	}
	if index < 0 {
		t.Fatalf("no GPU free of claims and MIG devices (in use: %v)", used)
	}
	if err := env.runner.SimulateEvent(ctx, env.node, map[string]string{"gpu": strconv.Itoa(index), "xid": strconv.Itoa(xid)}); err != nil {
		t.Fatal(err)
	}
	t.Logf("injected XID %d into GPU %d", xid, index)
}
