package publisher

import (
	"context"
	"errors"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
)

type snapshots chan health.Snapshot

func (s snapshots) Subscribe(context.Context) <-chan health.Snapshot { return s }

// recorder records each publication's taints of gpu-0 and fails the first
// publication with failFirst.
type recorder struct {
	failFirst error
	taints    [][]resourceapi.DeviceTaint
}

func (r *recorder) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	r.taints = append(r.taints, res.Pools["node-1"].Slices[0].Devices[0].Taints)
	if len(r.taints) == 1 && r.failFirst != nil {
		return r.failFirst
	}
	return nil
}

// TestRun: every health snapshot publishes the resources again, with the
// unhealthy GPU's devices tainted and a recovered one untainted; a failed
// publication does not stop the loop.
func TestRun(t *testing.T) {
	res := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{"node-1": {Slices: []resourceslice.Slice{{Devices: []resourceapi.Device{{Name: "gpu-0"}}}}}}}
	since := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	healthy := health.Snapshot{"GPU-0": {UUID: "GPU-0"}}
	xid := health.Snapshot{"GPU-0": {UUID: "GPU-0", Unhealthy: &health.Condition{Reason: "XID48", Message: "XID 48", Since: since, LastEvent: since, Events: 1}}}
	for name, failFirst := range map[string]error{"publications succeed": nil, "first publication fails": errors.New("API server down")} {
		t.Run(name, func(t *testing.T) {
			snaps := make(snapshots, 3)
			snaps <- healthy
			snaps <- xid
			snaps <- healthy
			close(snaps)
			target := &recorder{failFirst: failFirst}
			Run(context.Background(), Options{
				Target: target, Health: snaps, Resources: res, Policy: health.DefaultTaintPolicy("gpu.dra.dev"),
				Devices: func() []health.Device { return []health.Device{{Pool: "node-1", Name: "gpu-0", GPUUUID: "GPU-0"}} },
			})
			if len(target.taints) != 3 {
				t.Fatalf("%d publications, want one per snapshot (3)", len(target.taints))
			}
			if len(target.taints[0]) != 0 || len(target.taints[2]) != 0 {
				t.Errorf("healthy GPU's device tainted: %v, %v", target.taints[0], target.taints[2])
			}
			if tt := target.taints[1]; len(tt) != 1 || tt[0].Key != "gpu.dra.dev/unhealthy" || tt[0].Value != "XID48" || tt[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
				t.Errorf("unhealthy GPU's device taints: %v, want gpu.dra.dev/unhealthy=XID48:NoSchedule", tt)
			}
			if len(res.Pools["node-1"].Slices[0].Devices[0].Taints) != 0 {
				t.Error("Run changed Options.Resources")
			}
		})
	}
}
