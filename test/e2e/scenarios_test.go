package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
)

// TestScenarios runs every scenario of demo/specs, as `make demo` does, checks what
// the demo checks (every container sees exactly its allocated devices), then what
// the scenario is about, and that kubectl gpu nodes / claims -A (-o json) report the
// claims' allocations.
func TestScenarios(t *testing.T) {
	all, err := scenarios.Load(filepath.Join(env.repoRoot, "demo", "specs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		t.Run(s.Name, func(t *testing.T) {
			ctx := testContext(t)
			r := env.runner
			if n := s.FleetNodes(); n > 0 {
				useFleet(t, n)
			}
			startScenario(t, ctx, s)
			reps, err := r.Inspect(ctx, s)
			if err != nil {
				t.Fatal(err)
			}
			for _, rep := range reps {
				for _, p := range r.Check(rep) {
					t.Error(p)
				}
			}
			check, ok := scenarioChecks[s.Name]
			if !ok {
				t.Fatalf("no assertions for scenario %s: add them to scenarioChecks", s.Name)
			}
			check(t, pods(reps))
			// kubectl gpu reports exactly what the claims hold while the scenario runs.
			problems, err := r.CheckKubectlGPU(ctx)
			if err != nil {
				t.Error(err)
			}
			for _, p := range problems {
				t.Error(p)
			}
			if t.Failed() {
				for _, rep := range reps {
					var b strings.Builder
					scenarios.PrintPod(&b, rep)
					t.Log("\n" + b.String())
				}
			}
		})
	}
}

// podSet indexes reports by pod name.
type podSet map[string]*scenarios.PodReport

func pods(reps []*scenarios.PodReport) podSet {
	out := podSet{}
	for _, r := range reps {
		out[r.Name] = r
	}
	return out
}

// get returns the named pod's report, failing if it is missing.
func (p podSet) get(t *testing.T, name string) *scenarios.PodReport {
	t.Helper()
	r, ok := p[name]
	if !ok {
		t.Fatalf("no pod %s", name)
	}
	return r
}

// devices returns the pod's allocated devices (all claims).
func devices(r *scenarios.PodReport) []scenarios.DeviceReport {
	var out []scenarios.DeviceReport
	for _, c := range r.Claims {
		out = append(out, c.Devices...)
	}
	return out
}

// only returns the pod's single device.
func only(t *testing.T, r *scenarios.PodReport) scenarios.DeviceReport {
	t.Helper()
	d := devices(r)
	if len(d) != 1 {
		t.Fatalf("pod %s: want 1 allocated device, got %d: %+v", r.Name, len(d), d)
	}
	return d[0]
}

func env0(r *scenarios.PodReport, name string) string {
	for _, c := range r.ContainerOrder {
		return r.Containers[c].Env[name]
	}
	return ""
}

var scenarioChecks = map[string]func(t *testing.T, p podSet){
	"01-first-gpu": func(t *testing.T, p podSet) {
		dra, ext := p.get(t, "gpu-pod"), p.get(t, "gpu-pod-extended")
		if d := only(t, dra); d.Attributes["type"] != "gpu" {
			t.Errorf("gpu-pod got %s, want a whole GPU", d.Device)
		}
		if len(ext.Claims) != 1 || !ext.Claims[0].Extended {
			t.Fatalf("gpu-pod-extended: want one claim made for nvidia.com/gpu, have %+v", ext.Claims)
		}
		if d := only(t, ext); d.Attributes["type"] != "gpu" {
			t.Errorf("gpu-pod-extended got %s, want a whole GPU", d.Device)
		}
		if only(t, dra).Device == only(t, ext).Device {
			t.Errorf("both pods got %s", only(t, dra).Device)
		}
	},
	"02-timeslice": func(t *testing.T, p podSet) {
		if len(p) != 4 {
			t.Fatalf("want 4 pods, have %d", len(p))
		}
		device, shares := "", map[string]bool{}
		for _, r := range p {
			d := only(t, r)
			if d.Attributes["type"] != "timeslice" {
				t.Errorf("pod %s got %s, want a time-slicing share", r.Name, d.Device)
			}
			if device != "" && d.Device != device {
				t.Errorf("shares on different GPUs: %s and %s", device, d.Device)
			}
			device = d.Device
			shares[d.ShareID] = true
			if env0(r, "NVIDIA_VISIBLE_DEVICES") != d.Attributes["uuid"] {
				t.Errorf("pod %s sees %q, want the shared GPU %s", r.Name, env0(r, "NVIDIA_VISIBLE_DEVICES"), d.Attributes["uuid"])
			}
		}
		if len(shares) != 4 {
			t.Errorf("want 4 distinct share IDs, have %v", shares)
		}
	},
	"03-mps": func(t *testing.T, p podSet) {
		half, quarter := p.get(t, "mps-half"), p.get(t, "mps-quarter")
		dh, dq := only(t, half), only(t, quarter)
		if dh.Attributes["type"] != "mps" || dh.Device != dq.Device {
			t.Errorf("want two MPS shares of one GPU, got %s and %s", dh.Device, dq.Device)
		}
		for _, c := range []struct {
			r                    *scenarios.PodReport
			d                    scenarios.DeviceReport
			compute, memory, mem string
		}{{half, dh, "50", "20Gi", "0=20480M"}, {quarter, dq, "25", "10Gi", "0=10240M"}} {
			if c.d.Consumed["compute"] != c.compute || c.d.Consumed["memory"] != c.memory {
				t.Errorf("pod %s consumed %v, want compute=%s memory=%s", c.r.Name, c.d.Consumed, c.compute, c.memory)
			}
			if got := env0(c.r, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); got != c.compute {
				t.Errorf("pod %s: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%q, want %s", c.r.Name, got, c.compute)
			}
			if got := env0(c.r, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"); got != c.mem {
				t.Errorf("pod %s: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q, want %s", c.r.Name, got, c.mem)
			}
		}
	},
	"04-mig": func(t *testing.T, p podSet) {
		small, big := only(t, p.get(t, "mig-1g")), only(t, p.get(t, "mig-3g"))
		if small.Attributes["profile"] != "1g.10gb" || big.Attributes["profile"] != "3g.40gb" {
			t.Errorf("profiles %q and %q, want 1g.10gb and 3g.40gb", small.Attributes["profile"], big.Attributes["profile"])
		}
		if small.GPU() != big.GPU() {
			t.Errorf("MIG devices on GPUs %s and %s, want one GPU", small.GPU(), big.GPU())
		}
		instances := migUUIDs(t)
		for _, name := range []string{"mig-1g", "mig-3g"} {
			uuid := env0(p.get(t, name), "NVIDIA_VISIBLE_DEVICES")
			if _, ok := instances[uuid]; !ok {
				t.Errorf("pod %s sees %s, which is not a MIG instance of the simulated GPUs %v", name, uuid, instances)
			}
		}
	},
	"09-mig-mps": func(t *testing.T, p podSet) {
		a, b := p.get(t, "mig-mps-a"), p.get(t, "mig-mps-b")
		da := only(t, a)
		if da.Attributes["profile"] != "2g.20gb" || da.Device != only(t, b).Device {
			t.Errorf("want one 2g.20gb MIG device for both pods, got %s (%s) and %s", da.Device, da.Attributes["profile"], only(t, b).Device)
		}
		uuid := env0(a, "NVIDIA_VISIBLE_DEVICES")
		for _, r := range []*scenarios.PodReport{a, b} {
			if got := env0(r, "NVIDIA_VISIBLE_DEVICES"); got != uuid || !strings.HasPrefix(got, "MIG-") {
				t.Errorf("pod %s sees %q, want the shared MIG device %s", r.Name, got, uuid)
			}
			if got := env0(r, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); got != "50" {
				t.Errorf("pod %s: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%q, want 50", r.Name, got)
			}
			if d := only(t, r); len(d.MPSDaemons) != 1 {
				t.Errorf("pod %s: want one MPS control daemon pod for %s, have %v", r.Name, uuid, d.MPSDaemons)
			}
		}
	},
	"05-model": func(t *testing.T, p podSet) {
		h100 := only(t, p.get(t, "h100-only"))
		if !strings.HasPrefix(h100.Attributes["productName"], "NVIDIA H100") {
			t.Errorf("h100-only got a %s", h100.Attributes["productName"])
		}
		pref := only(t, p.get(t, "prefer-h200"))
		if pref.Request != "gpu/h100" || !strings.HasPrefix(pref.Attributes["productName"], "NVIDIA H100") {
			t.Errorf("prefer-h200 got %s from request %s, want an H100 from gpu/h100 (no H200 here)", pref.Attributes["productName"], pref.Request)
		}
	},
	"06-topology": func(t *testing.T, p podSet) {
		d := devices(p.get(t, "two-gpus"))
		if len(d) != 2 {
			t.Fatalf("want 2 GPUs, got %d", len(d))
		}
		for _, attr := range []string{"resource.kubernetes.io/numaNode", "nvlinkDomain"} {
			if d[0].Attributes[attr] == "" || d[0].Attributes[attr] != d[1].Attributes[attr] {
				t.Errorf("%s: %q and %q, want equal", attr, d[0].Attributes[attr], d[1].Attributes[attr])
			}
		}
	},
	"07-quota": func(t *testing.T, p podSet) {
		for _, name := range []string{"quota-1", "quota-2"} {
			if r := p.get(t, name); r.Phase != corev1.PodRunning {
				t.Errorf("%s is %s", name, r.Phase)
			}
		}
		if r := p.get(t, "quota-3"); r.Phase != corev1.PodPending || len(r.Claims) != 0 {
			t.Errorf("quota-3 is %s with claims %v, want Pending without a claim", r.Phase, r.Claims)
		}
		q, err := env.cluster.Client.CoreV1().ResourceQuotas("demo-quota").Get(testContext(t), "gpus", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		used := q.Status.Used["gpu.dra.dev.deviceclass.resource.k8s.io/devices"]
		if used.Value() != 2 {
			t.Errorf("quota used %s, want 2", used.String())
		}
	},
	"11-fleet-models": func(t *testing.T, p podSet) {
		// The runner checked each pod's node label against its model.
		if h, l := p.get(t, "h100"), p.get(t, "l4"); h.Node == l.Node || h.Node == "" {
			t.Errorf("h100 on %q and l4 on %q: want nodes of their models", h.Node, l.Node)
		}
		if r := p.get(t, "l4-x5"); r.Phase != corev1.PodPending || r.Node != "" {
			t.Errorf("l4-x5 is %s on %q, want Pending", r.Phase, r.Node)
		}
	},
	"12-fleet-gang": func(t *testing.T, p podSet) {
		nodes := map[string]int{}
		for i := range 2 {
			r := p.get(t, "train-"+string(rune('0'+i)))
			if r.Phase != corev1.PodRunning || len(devices(r)) != 8 {
				t.Errorf("%s is %s with %d devices, want Running with 8", r.Name, r.Phase, len(devices(r)))
			}
			nodes[r.Node]++
		}
		if len(nodes) != 2 {
			t.Errorf("train pods on %v, want one on each of two nodes", nodes)
		}
		for i := range 3 {
			if r := p.get(t, "big-"+string(rune('0'+i))); r.Node != "" || len(devices(r)) != 0 {
				t.Errorf("%s of the gang that cannot fit is on %q with %d devices", r.Name, r.Node, len(devices(r)))
			}
		}
	},
	"08-gang": func(t *testing.T, p podSet) {
		var all []string
		for i := range 4 {
			r := p.get(t, "train-"+string(rune('0'+i)))
			if r.Phase != corev1.PodRunning {
				t.Errorf("%s is %s", r.Name, r.Phase)
			}
			for _, d := range devices(r) {
				all = append(all, d.Device)
			}
		}
		slices.Sort(all)
		if len(slices.Compact(all)) != 8 {
			t.Errorf("train gang: want 8 distinct GPUs, got %v", all)
		}
		for i := range 3 {
			r := p.get(t, "big-"+string(rune('0'+i)))
			if r.Phase != corev1.PodPending || r.Node != "" {
				t.Errorf("%s is %s on %q, want Pending and unbound", r.Name, r.Phase, r.Node)
			}
		}
	},
}

// startScenario applies a demo scenario, waits until its pods run, and
// removes it when the test ends.
func startScenario(t *testing.T, ctx context.Context, s *scenarios.Scenario) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := env.runner.Cleanup(ctx, s); err != nil {
			t.Errorf("cleanup %s: %v", s.Name, err)
		}
	})
	if err := env.runner.Apply(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := env.runner.Wait(ctx, s); err != nil {
		t.Fatal(err)
	}
}

// startDemoSpec is startScenario for the file demo/specs/<file>.
func startDemoSpec(t *testing.T, ctx context.Context, file string) *scenarios.Scenario {
	t.Helper()
	s, err := scenarios.LoadFile(filepath.Join(env.repoRoot, "demo", "specs", file))
	if err != nil {
		t.Fatal(err)
	}
	startScenario(t, ctx, s)
	return s
}
