package health

import (
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

func TestDevicesFromPublishedAndReport(t *testing.T) {
	g0 := &discovery.GPU{UUID: "GPU-0", Minor: 0}
	g1 := &discovery.GPU{UUID: "GPU-1", Minor: 1}
	published := []devicemodel.Published{
		{Device: resourceapi.Device{Name: "gpu-0"}, Type: string(vocabulary.KindGPU), GPU: g0},
		{Device: resourceapi.Device{Name: "gpu-0-ts"}, Type: string(vocabulary.KindTimeSlice), GPU: g0},
		{Device: resourceapi.Device{Name: "gpu-0-mig-1g.10gb-6"}, Type: string(vocabulary.KindMIG), GPU: g0},
		{Device: resourceapi.Device{Name: "gpu-0-mig-1g.10gb-5"}, Type: string(vocabulary.KindMIG), GPU: g0},
		{Device: resourceapi.Device{Name: "gpu-1-mig-gi2-ci0"}, Type: string(vocabulary.KindMIG), GPU: g1,
			StaticMIG: &mig.Instance{GPUUUID: "GPU-1", GIID: 2, CIID: 0}},
	}
	prepared := []checkpoint.PreparedClaim{{Devices: []checkpoint.PreparedDevice{
		{Pool: "node-1", Device: "gpu-0-mig-1g.10gb-6", MIG: &checkpoint.MigInstance{ParentUUID: "GPU-0", GIID: 9, CIID: 0}},
	}}}
	devices := DevicesFromPublished("node-1", published, prepared)
	if len(devices) != len(published) {
		t.Fatalf("got %d devices, want %d", len(devices), len(published))
	}
	byName := map[string]Device{}
	for _, d := range devices {
		byName[d.Name] = d
	}
	if d := byName["gpu-0-mig-1g.10gb-6"]; d.MIG == nil || d.MIG.GPUInstance != 9 {
		t.Errorf("prepared dynamic MIG device: %+v, want GI 9", d)
	}
	if d := byName["gpu-0-mig-1g.10gb-5"]; d.MIG != nil {
		t.Errorf("unprepared placement has a MIG instance: %+v", d.MIG)
	}
	if d := byName["gpu-1-mig-gi2-ci0"]; d.MIG == nil || d.MIG.GPUInstance != 2 || d.GPUUUID != "GPU-1" {
		t.Errorf("static MIG device: %+v", d)
	}

	// GI 9 on GPU-0 is unhealthy; GPU-1 is lost.
	snap := Snapshot{
		"GPU-0": {UUID: "GPU-0", MIG: []MIGCondition{{MIGInstance: MIGInstance{9, 0}, Condition: Condition{Reason: "XID94", Message: "XID 94", Since: t0, LastEvent: t0, Events: 1}}}},
		"GPU-1": {UUID: "GPU-1", Lost: true, Unhealthy: &Condition{Reason: ReasonGPULost, Message: "lost", Since: t0, LastEvent: t0, Events: 1}},
	}
	report := Report(snap, devices, time.Minute, t0)
	want := map[string]kubeletplugin.HealthStatus{
		"gpu-0": "Healthy", "gpu-0-ts": "Healthy", "gpu-0-mig-1g.10gb-5": "Healthy",
		"gpu-0-mig-1g.10gb-6": "Unhealthy", "gpu-1-mig-gi2-ci0": "Unhealthy",
	}
	for _, d := range report.Devices {
		if d.Health != want[d.DeviceName] {
			t.Errorf("%s: %s, want %s", d.DeviceName, d.Health, want[d.DeviceName])
		}
		if d.DeviceName == "gpu-1-mig-gi2-ci0" && !strings.Contains(d.Message, "reset or reboot") {
			t.Errorf("message of a lost GPU's device: %q", d.Message)
		}
		if !d.LastUpdated.Equal(t0) || d.HealthCheckTimeout != time.Minute {
			t.Errorf("%s: updated %v, timeout %v", d.DeviceName, d.LastUpdated, d.HealthCheckTimeout)
		}
	}
	p := DefaultTaintPolicy("gpu.dra.dev")
	if taints := DeviceTaints(snap, byName["gpu-0-mig-1g.10gb-6"], p); len(taints) != 1 || taints[0].Value != "XID94" {
		t.Errorf("taints of the unhealthy MIG device: %v", taints)
	}
	if taints := DeviceTaints(snap, byName["gpu-0"], p); len(taints) != 0 {
		t.Errorf("taints of the healthy whole GPU: %v", taints)
	}
}

func TestTaintResources(t *testing.T) {
	other := resourceapi.DeviceTaint{Key: "example.com/maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{"node-1": {Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{
		{Name: "gpu-0", Taints: []resourceapi.DeviceTaint{other}},
		{Name: "gpu-0-ts"},
		{Name: "gpu-1", Taints: []resourceapi.DeviceTaint{{Key: "gpu.dra.dev/unhealthy", Value: "XID48", Effect: resourceapi.DeviceTaintEffectNoSchedule}}},
	}}}}}}
	devices := []Device{{Pool: "node-1", Name: "gpu-0", GPUUUID: "GPU-0"}, {Pool: "node-1", Name: "gpu-0-ts", GPUUUID: "GPU-0"}, {Pool: "node-1", Name: "gpu-1", GPUUUID: "GPU-1"}}
	snap := Snapshot{
		"GPU-0": {UUID: "GPU-0", Lost: true, Unhealthy: &Condition{Reason: ReasonGPULost, Since: t0}},
		"GPU-1": {UUID: "GPU-1"}, // recovered
	}
	got := TaintResources(res, snap, devices, DefaultTaintPolicy("gpu.dra.dev")).Pools["node-1"].Slices[0].Devices
	if len(got[0].Taints) != 2 || got[0].Taints[0] != other || got[0].Taints[1].Value != ReasonGPULost || got[0].Taints[1].Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Errorf("gpu-0 taints: %v", got[0].Taints)
	}
	if len(got[1].Taints) != 1 {
		t.Errorf("gpu-0-ts taints: %v", got[1].Taints)
	}
	if len(got[2].Taints) != 0 {
		t.Errorf("recovered gpu-1 still tainted: %v", got[2].Taints)
	}
	if orig := res.Pools["node-1"].Slices[0].Devices; len(orig[0].Taints) != 1 || len(orig[1].Taints) != 0 || len(orig[2].Taints) != 1 {
		t.Error("TaintResources modified its input")
	}
}
