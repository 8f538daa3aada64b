package telemetry

import (
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

func TestDriverMetrics(t *testing.T) {
	m := NewDriverMetrics("node-1")
	h := Handler(NewRegistry(m, nil))

	m.ObservePrepare(string(vocabulary.KindMIG), time.Now().Add(-1500*time.Millisecond), nil)
	m.ObservePrepare(string(vocabulary.KindGPU), time.Now(), errors.New("boom"))
	m.ObserveUnprepare(string(vocabulary.KindMIG), time.Now(), nil)
	m.ObserveError(OperationPrepare, ReasonMIG)
	m.ObserveHealthEvent(health.Event{GPUUUID: "GPU-1", Type: health.EventXID, XID: 48})
	m.ObserveHealthEvent(health.Event{GPUUUID: "GPU-1", Type: health.EventXID, XID: 13, Ignored: true})
	m.UpdateFromCheckpoint([]checkpoint.PreparedClaim{
		{State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{
			{Kind: string(vocabulary.KindMIG), GPUUUID: "GPU-0", MIG: &checkpoint.MigInstance{CreatedByDriver: true}},
			{Kind: string(vocabulary.KindMIG), GPUUUID: "GPU-0", MIG: &checkpoint.MigInstance{CreatedByDriver: false}},
		}},
		{State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{{Kind: string(vocabulary.KindMPS), GPUUUID: "GPU-1"}}},
		{State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{{Kind: string(vocabulary.KindMPS), GPUUUID: "GPU-1"}}},
		{State: checkpoint.PrepareStarted, Devices: []checkpoint.PreparedDevice{{Kind: string(vocabulary.KindGPU), GPUUUID: "GPU-2"}}},
	})

	f := scrape(t, h)
	hist := sampleOf(t, f, "gpu_dra_plugin_prepare_duration_seconds", map[string]string{"kind": "mig", "result": "success"}).GetHistogram()
	if hist.GetSampleCount() != 1 || hist.GetSampleSum() < 1.5 {
		t.Errorf("prepare histogram: %d samples, sum %v", hist.GetSampleCount(), hist.GetSampleSum())
	}
	if sampleOf(t, f, "gpu_dra_plugin_prepare_duration_seconds", map[string]string{"kind": "gpu", "result": "error"}).GetHistogram().GetSampleCount() != 1 {
		t.Error("failed prepare not observed")
	}
	if sampleOf(t, f, "gpu_dra_plugin_unprepare_duration_seconds", nil).GetHistogram().GetSampleCount() != 1 {
		t.Error("unprepare not observed")
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"gpu_dra_plugin_errors_total", map[string]string{"node": "node-1", "operation": "prepare", "reason": "mig"}, 1},
		{"gpu_dra_health_events_total", map[string]string{"uuid": "GPU-1", "event": "xid", "xid": "48", "ignored": "false"}, 1},
		{"gpu_dra_health_events_total", map[string]string{"xid": "13", "ignored": "true"}, 1},
		{"gpu_dra_plugin_allocated_devices", map[string]string{"kind": "mig"}, 2},
		{"gpu_dra_plugin_allocated_devices", map[string]string{"kind": "mps"}, 2},
		{"gpu_dra_plugin_allocated_devices", map[string]string{"kind": "gpu"}, 0}, // only started
		{"gpu_dra_plugin_allocated_devices", map[string]string{"kind": "timeslice"}, 0},
		{"gpu_dra_plugin_mig_instances", nil, 1},
		{"gpu_dra_plugin_mps_daemons", nil, 1},
	}
	for _, c := range checks {
		if v := value(sampleOf(t, f, c.name, c.labels)); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}

	// Claims going away bring the gauges back to zero.
	m.UpdateFromCheckpoint(nil)
	f = scrape(t, h)
	if v := value(sampleOf(t, f, "gpu_dra_plugin_allocated_devices", map[string]string{"kind": "mig"})); v != 0 {
		t.Errorf("allocated MIG devices after all claims went: %v", v)
	}
}

func TestUnregisteredDriverMetricsAreNoOps(t *testing.T) {
	m := NewDriverMetrics("node-1")
	m.ObservePrepare("gpu", time.Now(), nil)
	m.UpdateFromCheckpoint(nil)
	m.ObserveHealthEvent(health.Event{Type: health.EventGPULost})
}

func TestHoldersFromClaims(t *testing.T) {
	claims := []checkpoint.PreparedClaim{
		{UID: "u1", Namespace: "a", Name: "shared", State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{
			{Device: "gpu-0-ts", UUIDs: []string{"GPU-0"}},
		}},
		{UID: "u2", Namespace: "b", Name: "mig", State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{
			{Device: "gpu-1-mig-1g.10gb-6", UUIDs: []string{"MIG-1"}},
		}},
		{UID: "u3", Namespace: "c", Name: "half", State: checkpoint.PrepareStarted, Devices: []checkpoint.PreparedDevice{
			{Device: "gpu-2", UUIDs: []string{"GPU-2"}},
		}},
	}
	pods := map[types.UID][]Consumer{"u1": {{Pod: "p1"}, {Pod: "p2", Container: "c"}}}
	got := HoldersFromClaims(claims, func(uid types.UID) []Consumer { return pods[uid] })
	if len(got["GPU-0"]) != 2 || got["GPU-0"][1] != (Holder{Device: "gpu-0-ts", Namespace: "a", Claim: "shared", Pod: "p2", Container: "c"}) {
		t.Errorf("GPU-0 holders: %+v", got["GPU-0"])
	}
	if h := got["MIG-1"]; len(h) != 1 || h[0] != (Holder{Device: "gpu-1-mig-1g.10gb-6", Namespace: "b", Claim: "mig"}) {
		t.Errorf("MIG-1 holders: %+v", h)
	}
	if _, ok := got["GPU-2"]; ok {
		t.Error("a claim still being prepared has holders")
	}
}
