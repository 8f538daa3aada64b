package hwcheck

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

func simConfig(t *testing.T, machine string) Config {
	t.Helper()
	return Config{
		Hardware: nodeplugin.Config{Simulate: machine}, NodeName: "gpu-check", OutDir: t.TempDir(),
		Deadline: 3 * time.Minute, PhaseTimeout: time.Minute, HealthWatch: 500 * time.Millisecond, ExpectClean: true,
	}
}

func readReport(t *testing.T, dir string) (*Report, string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, ReportJSON))
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("%s: %v", ReportJSON, err)
	}
	md, err := os.ReadFile(filepath.Join(dir, ReportMarkdown))
	if err != nil {
		t.Fatal(err)
	}
	return &r, string(md)
}

// The dry run `make check` relies on: the simulated machine compared with
// itself has no finding, and the report has every section.
func TestRunSimulatedIsClean(t *testing.T) {
	cfg := simConfig(t, "dgxh200")
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("default:\n  mig: \"off\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.DevicePolicyFile = policy
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("Run: %v", err)
	}
	r, md := readReport(t, cfg.OutDir)
	if f := r.Findings(); len(f) > 0 {
		t.Errorf("findings: %v", f)
	}
	for _, section := range []string{"## Machine", "## Findings", "## Read-only guard", "## Comparison with the simulated dgxh200",
		"## Print-slices", "## Prepare and unprepare of a whole GPU", "## Health", "## Telemetry", "## NVML calls", "## Timings"} {
		if !strings.Contains(md, "\n"+section) {
			t.Errorf("report lacks section %q", section)
		}
	}
	var phases []string
	for _, p := range r.Phases {
		phases = append(phases, p.Name)
	}
	if want := []string{"nvml-init", "discovery", "print-slices", "compare", "prepare", "health", "telemetry"}; !slices.Equal(phases, want) {
		t.Errorf("phases %v, want %v", phases, want)
	}
	if len(r.GPUs) != 8 || r.ComparedWith != "dgxh200" || r.Machine.DriverVersion == "" {
		t.Errorf("GPUs %d, compared with %q, driver %q", len(r.GPUs), r.ComparedWith, r.Machine.DriverVersion)
	}
	if len(r.Slices) != 2 || r.Slices[0].Devices <= r.Slices[1].Devices || r.Slices[1].Devices == 0 {
		t.Errorf("print-slices: %+v; the MIG-off policy should publish fewer devices than the default", r.Slices)
	}
	for _, f := range []string{r.Slices[0].File, r.Slices[1].File} {
		if _, err := os.Stat(filepath.Join(cfg.OutDir, f)); err != nil {
			t.Error(err)
		}
	}
	if r.Prepare == nil || len(r.Prepare.CDIDevices) != 1 || len(r.Prepare.Paths) < 5 {
		t.Errorf("prepare: %+v", r.Prepare)
	}
	if r.Health == nil || len(r.Health.Status) != 8 || r.Telemetry == nil || r.Telemetry.Samples == 0 {
		t.Errorf("health %+v, telemetry %+v", r.Health, r.Telemetry)
	}
	timed := map[string]bool{}
	for _, tm := range r.Timings {
		timed[tm.What] = true
	}
	for _, want := range []string{"NVML init", "discovery", "one telemetry scrape", "prepare of a whole GPU"} {
		if !timed[want] {
			t.Errorf("no timing of %s: %v", want, r.Timings)
		}
	}
}

// Compared with another model, every difference reaches the report and
// fails a run that expects none.
func TestRunReportsDifferences(t *testing.T) {
	cfg := simConfig(t, "dgxh200")
	cfg.CompareWith = "dgxh100"
	err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "none expected") {
		t.Fatalf("Run: %v, want the findings", err)
	}
	r, md := readReport(t, cfg.OutDir)
	var product bool
	for _, d := range r.Differences {
		product = product || (d.What == "model productName" && d.Simulated == "NVIDIA H100 80GB HBM3" && d.Real == "NVIDIA H200")
	}
	if !product || len(r.Differences) < 10 {
		t.Errorf("differences: %v", r.Differences)
	}
	if !strings.Contains(md, "| model productName |") {
		t.Error("the Markdown report lacks the differences table")
	}
}

// A whole-GPU prepare on a GPU left in MIG mode would turn MIG off: the
// guard refuses it, the prepare fails and the report names the setter.
func TestRunReportsRefusedSetter(t *testing.T) {
	cfg := simConfig(t, "dgxh100")
	work := t.TempDir()
	// The plugin's simulated machine keeps its state in its data dir
	// (pkg/nodeplugin); start it with MIG mode on and no instance.
	state := filepath.Join(work, "n", "plugin", "simulated-dgxh100", "nvml-state.json")
	m, err := nvmlsim.New("dgxh100", nvmlsim.WithSeed(cfg.NodeName), nvmlsim.WithStateFile(state))
	if err != nil {
		t.Fatal(err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	for i := range m.GPUCount() {
		dev, _ := m.DeviceGetHandleByIndex(i)
		if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
	}
	m.Shutdown()

	if err := run(context.Background(), cfg, work); err == nil {
		t.Fatal("Run succeeded with a refused setter")
	}
	r, md := readReport(t, cfg.OutDir)
	if !slices.Contains(r.Violation, Violation{Phase: "prepare", Method: "Device.SetMigMode"}) {
		t.Errorf("violations %v lack the prepare's SetMigMode", r.Violation)
	}
	if !strings.Contains(md, "`Device.SetMigMode` in phase prepare") {
		t.Error("the Markdown report does not name the refused setter")
	}
	var failed bool
	for _, p := range r.Phases {
		failed = failed || (p.Name == "prepare" && strings.Contains(p.Error, "turn off MIG mode") && strings.Contains(p.Error, "NO_PERMISSION"))
	}
	if !failed {
		t.Errorf("phases %+v: the prepare should fail turning MIG off, with the refusal", r.Phases)
	}
	cur, err := nvmlsim.New("dgxh100", nvmlsim.WithSeed(cfg.NodeName), nvmlsim.WithStateFile(state))
	if err != nil {
		t.Fatal(err)
	}
	cur.Init()
	defer cur.Shutdown()
	dev, _ := cur.DeviceGetHandleByIndex(0)
	if mode, _, _ := dev.GetMigMode(); mode != nvml.DEVICE_MIG_ENABLE {
		t.Error("MIG mode changed behind the guard")
	}
}

// Past the deadline the remaining phases are skipped and the report is
// still written.
func TestRunDeadlineStillWritesReport(t *testing.T) {
	cfg := simConfig(t, "dgxh200")
	cfg.Deadline, cfg.PhaseTimeout, cfg.HealthWatch = 2*time.Second, 2*time.Second, time.Second
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	if err := Run(ctx, cfg); err == nil {
		t.Fatal("Run succeeded with no time at all")
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("Run took %v past its deadline", time.Since(start))
	}
	r, _ := readReport(t, cfg.OutDir)
	if len(r.Phases) == 0 || !strings.HasPrefix(r.Phases[0].Error, "skipped") {
		t.Errorf("phases %+v, want the first skipped", r.Phases)
	}
}
