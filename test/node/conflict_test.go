package node

import (
	"context"
	"strings"
	"testing"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
)

// A whole GPU is refused while a MIG device carved from it is prepared,
// even if an allocation (stale, or made without the scheduler's counters)
// names both: the names differ, the hardware is the same.
func TestPrepareRefusesPhysicalOverlap(t *testing.T) {
	ctx := context.Background()
	_, node, claims, start := setupClaims(t, at.Claim("mig", at.Exactly("mig", "mig."+driverName, 1,
		`device.attributes["gpu.dra.dev"].parentMinor == 0`, `device.attributes["gpu.dra.dev"].profile == "1g.10gb"`)))
	// Allocated as if the MIG claim did not exist.
	other := at.NewCluster(node.Slices(driverName), deviceclass.DeviceClasses(driverName))
	whole := other.MustAllocate(t, nodeName, at.Claim("whole", at.Exactly("gpus", driverName, 1,
		`device.attributes["gpu.dra.dev"].minor == 0`)))[0]
	whole.UID = "whole-uid"
	p := start(whole)
	defer func() { _ = p.Stop() }()

	if _, err := p.Kubelet.PrepareOne(ctx, claims["mig"]); err != nil {
		t.Fatal(err)
	}
	_, err := p.Kubelet.PrepareOne(ctx, whole)
	if err == nil || !strings.Contains(err.Error(), "already prepared for claim default/mig") {
		t.Fatalf("whole GPU 0 under a prepared MIG device: err = %v, want a conflict naming the MIG claim", err)
	}
	// Once the MIG claim is gone, the GPU can be used whole.
	if err := p.Kubelet.UnprepareOne(ctx, claims["mig"]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Kubelet.PrepareOne(ctx, whole); err != nil {
		t.Fatalf("whole GPU after the MIG claim was unprepared: %v", err)
	}
}
