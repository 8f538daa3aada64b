package telemetry

import (
	"errors"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
)

func TestDriverMetrics(t *testing.T) {
	m := NewDriverMetrics("node-1")
	h := Handler(NewRegistry(m, nil))

	m.ObservePrepare("mig", time.Now().Add(-1500*time.Millisecond), nil)
	m.ObservePrepare("gpu", time.Now(), errors.New("boom"))
	m.ObserveUnprepare("mig", time.Now(), nil)
	m.ObserveError(OperationPrepare, ReasonMIG)
	m.ObserveHealthEvent(health.Event{GPUUUID: "GPU-1", Type: health.EventXID, XID: 48})
	m.ObserveHealthEvent(health.Event{GPUUUID: "GPU-1", Type: health.EventXID, XID: 13, Ignored: true})
	// The figures of pkg/prepare's TestAllocations.
	m.SetAllocations(Allocations{Devices: map[string]int{"gpu": 0, "mig": 2, "timeslice": 0, "mps": 2}, MIGInstances: 1, MPSDaemons: 1})

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
	m.SetAllocations(Allocations{})
	f = scrape(t, h)
	if v := value(sampleOf(t, f, "gpu_dra_plugin_allocated_devices", map[string]string{"kind": "mig"})); v != 0 {
		t.Errorf("allocated MIG devices after all claims went: %v", v)
	}
}

func TestUnregisteredDriverMetricsAreNoOps(t *testing.T) {
	m := NewDriverMetrics("node-1")
	m.ObservePrepare("gpu", time.Now(), nil)
	m.SetAllocations(Allocations{})
	m.ObserveHealthEvent(health.Event{Type: health.EventGPULost})
}
