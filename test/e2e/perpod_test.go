package e2e

import (
	"math"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// topTolerance is how far, in SM percentage points, a pod's reading may be
// from its declared load.
const topTolerance = 2

func init() {
	scenarioChecks["10-gpu-top"] = func(t *testing.T, p podSet) {
		for _, name := range []string{"trainer", "notebook"} {
			if d := only(t, p.get(t, name)); d.Attributes[vocabulary.AttrType] != string(vocabulary.KindTimeSlice) {
				t.Errorf("%s got %s (%s), want a time-slicing share", name, d.Device, d.Attributes[vocabulary.AttrType])
			}
		}
	}
}

// TestPerPodUse runs the demo's two time-sliced pods with different loads:
// kubectl gpu top (through pods/portforward) shows each pod's declared SM
// share and memory, the GPU-wide reading is their sum, and a pod that
// stops its load drops to zero while its neighbour does not.
func TestPerPodUse(t *testing.T) {
	if _, err := env.runner.KubectlGPU(testContext(t), "--help"); err != nil {
		t.Skipf("kubectl gpu is not available (%v); build it with make build", err)
	}
	ctx := testContext(t)
	r := env.runner
	s := startDemoSpec(t, ctx, "10-gpu-top.yaml")
	loads := scenarios.Loads(s)
	if len(loads) != 2 {
		t.Fatalf("the scenario declares %d loads, want 2: %+v", len(loads), loads)
	}
	// As the demo shows it: waits until top tells the pods apart, prints the table.
	var table strings.Builder
	for _, p := range r.ShowTop(ctx, s, &table) {
		t.Error(p)
	}
	t.Log("\n" + table.String())
	if t.Failed() {
		t.FailNow()
	}
	list, err := r.Top(ctx, "-n", "demo-top")
	if err != nil {
		t.Fatal(err)
	}
	trainer, notebook := row(t, list, "trainer"), row(t, list, "notebook")
	gpuMemory := deviceMemory(t, r, trainer)
	for i, got := range []kubectlgpu.TopRow{trainer, notebook} {
		// The share's memory (its claim's consumed capacity) is less than the GPU's.
		if want := loads[i].MemoryBytes; got.MemoryUsedBytes != want || got.MemoryLimitBytes < want || got.MemoryLimitBytes >= gpuMemory ||
			got.Kind != "timeslice" || got.Processes != 1 {
			t.Errorf("%s: %+v, want %d bytes used of its share's memory (below the GPU's %d) on a time-slicing share, one process", got.Pod, got, want, gpuMemory)
		}
	}
	if trainer.UUID == notebook.UUID {
		// One GPU: its GPU-wide reading, the same for both holders, is their sum.
		body, err := r.PluginMetrics(ctx, trainer.Node)
		if err != nil {
			t.Fatal(err)
		}
		want := loads[0].SMPercent + loads[1].SMPercent
		if got := 100 * deviceGauge(t, body, "gpu_dra_device_utilization_ratio", trainer.UUID); math.Abs(got-want) > topTolerance {
			t.Errorf("GPU-wide utilization of %s: %.1f%%, want the pods' sum %.0f%%", trainer.UUID, got, want)
		}
	} else {
		t.Logf("the shares are on different GPUs (%s, %s): no common GPU-wide reading", trainer.UUID, notebook.UUID)
	}

	// The trainer stops its load; the notebook keeps its own.
	if err := r.StopLoad(ctx, loads[0]); err != nil {
		t.Fatal(err)
	}
	stopped := []scenarios.GPULoad{loads[0], loads[1]}
	stopped[0].SMPercent = 0
	list, problems, err := r.WaitTop(ctx, "demo-top", stopped, topTolerance)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if after := row(t, list, "trainer"); after.MemoryUsedBytes != 0 || after.Processes != 0 {
		t.Errorf("trainer after its load stopped: %+v, want no process and no memory", after)
	}
}

func row(t *testing.T, list *kubectlgpu.TopList, pod string) kubectlgpu.TopRow {
	t.Helper()
	for _, r := range list.Items {
		if r.Pod == pod {
			return r
		}
	}
	t.Fatalf("kubectl gpu top shows no row for pod %s: %+v", pod, list.Items)
	return kubectlgpu.TopRow{}
}

// deviceMemory is the memory of the GPU behind a row.
func deviceMemory(t *testing.T, r *scenarios.Runner, row kubectlgpu.TopRow) int64 {
	t.Helper()
	body, err := r.PluginMetrics(testContext(t), row.Node)
	if err != nil {
		t.Fatal(err)
	}
	return int64(deviceGauge(t, body, "gpu_dra_device_memory_total_bytes", row.UUID))
}

// deviceGauge is the value of a device reading of uuid (every holder's
// series of it carries the same GPU-wide value).
func deviceGauge(t *testing.T, body, name, uuid string) float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range families[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "uuid" && l.GetValue() == uuid {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s for %s", name, uuid)
	return 0
}
