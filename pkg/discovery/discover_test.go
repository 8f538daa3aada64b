package discovery_test

import (
	"context"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// A lost GPU is left out; the others are still discovered.
func TestDiscoverLeavesOutLostGPU(t *testing.T) {
	m, err := nvmlsim.New("dgxh100", nvmlsim.WithSeed("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer m.Shutdown()
	if err := m.SetGPULost(3, true); err != nil {
		t.Fatal(err)
	}
	gpus, err := discovery.Discover(context.Background(), m, discovery.Options{SysfsRoot: t.TempDir()})
	if err != nil {
		t.Fatalf("Discover with GPU 3 lost: %v", err)
	}
	if len(gpus) != m.GPUCount()-1 {
		t.Fatalf("discovered %d GPUs, want %d", len(gpus), m.GPUCount()-1)
	}
	for _, g := range gpus {
		if g.Index == 3 {
			t.Errorf("lost GPU 3 discovered: %+v", g)
		}
	}
}
