package discovery_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/passthrough"
)

// A GPU bound to vfio-pci is not in NVML; a discovery after a restart describes it from the
// inventory the last discovery wrote, as it was, and without the inventory leaves it out.
func TestDiscoverPassedThroughGPUFromInventory(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := nvmlsim.New("dgxh100", nvmlsim.WithSeed("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer m.Shutdown()
	sys := passthrough.Sysfs{Root: t.TempDir(), Timeout: 5 * time.Second}
	if err := m.WriteSysfs(sys.Root); err != nil {
		t.Fatal(err)
	}
	if err := m.ServeSysfs(ctx, sys.Root); err != nil {
		t.Fatal(err)
	}
	inv := filepath.Join(t.TempDir(), "gpus.json")
	opts := discovery.Options{SysfsRoot: sys.Root, InventoryFile: inv, WriteInventory: true}
	before, err := discovery.Discover(ctx, m, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := sys.ToVFIO(ctx, before[2].PCIBusID); err != nil {
		t.Fatal(err)
	}

	without, err := discovery.Discover(ctx, m, discovery.Options{SysfsRoot: sys.Root})
	if err != nil {
		t.Fatal(err)
	}
	if len(without) != len(before)-1 {
		t.Fatalf("without an inventory: %d GPUs, want %d", len(without), len(before)-1)
	}

	after, err := discovery.Discover(ctx, m, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) || !reflect.DeepEqual(after[2], before[2]) {
		t.Fatalf("with the inventory: GPU 2 = %+v, want %+v", after[2], before[2])
	}

	// MIG instances the inventory lists did not survive the unbind: none are described.
	stale := before
	stale[2].MIG.Instances = []mig.Instance{{GIID: 1, CIID: 0, UUID: "MIG-stale"}}
	data, err := json.Marshal(map[string]any{"gpus": stale})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(inv, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := discovery.Discover(ctx, m, opts); err != nil || got[2].MIG == nil || len(got[2].MIG.Instances) != 0 {
		t.Fatalf("GPU 2 from an inventory with MIG instances: %+v, %v; want none", got[2].MIG, err)
	}

	// The inventory written now still lists it; a GPU back on nvidia is NVML's again.
	if err := sys.ToNVIDIA(ctx, before[2].PCIBusID); err != nil {
		t.Fatal(err)
	}
	again, err := discovery.Discover(ctx, m, opts)
	if err != nil || len(again) != len(before) {
		t.Fatalf("GPU back on nvidia: %d GPUs, %v", len(again), err)
	}

	// A corrupt inventory is no reason not to start.
	if err := os.WriteFile(inv, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := discovery.Discover(ctx, m, opts); err != nil {
		t.Fatalf("corrupt inventory: %v", err)
	}
}
