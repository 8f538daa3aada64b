package node

import (
	"context"
	"strings"
	"testing"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
)

// A claim prepared on the node keeps what it got: the same UID with
// another allocation (the claim was re-allocated) is refused, naming both,
// instead of being handed the old devices.
func TestRePrepareWithAnotherAllocation(t *testing.T) {
	ctx := context.Background()
	_, node, claims, start := setupClaims(t, at.Claim("first", at.Exactly("gpus", driverName, 1,
		`device.attributes["gpu.dra.dev"].minor == 0`)))
	first := claims["first"]
	other := at.NewCluster(node.Slices(driverName), deviceclass.DeviceClasses(driverName))
	moved := other.MustAllocate(t, nodeName, at.Claim("moved", at.Exactly("gpus", driverName, 1,
		`device.attributes["gpu.dra.dev"].minor == 1`)))[0]
	moved.UID = first.UID
	p := start(moved)
	defer func() { _ = p.Stop() }()

	if _, err := p.Kubelet.PrepareOne(ctx, first); err != nil {
		t.Fatal(err)
	}
	_, err := p.Kubelet.PrepareOne(ctx, moved)
	if err == nil || !strings.Contains(err.Error(), "gpu-0") || !strings.Contains(err.Error(), "gpu-1") {
		t.Fatalf("prepare of the re-allocated claim: err = %v, want an error naming the recorded gpu-0 and the new gpu-1", err)
	}
}
