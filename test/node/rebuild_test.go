package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/plugintest"
	"github.com/gpu-dra/gpu-dra-driver/pkg/app"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// A checkpoint rebuilt from the CDI specs keeps an MPS share's daemon, also
// when the share's GPU is lost at that start: the spec names the GPU and the
// sharing record, so the MPS manager still counts the share as live.
func TestRebuildKeepsShare(t *testing.T) {
	ctx := context.Background()
	r := at.Exactly("mps", "mps."+driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`)
	r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		"compute": resource.MustParse("50"), "memory": resource.MustParse("20Gi"),
	}}
	dirs, _, claims, _ := setupClaims(t, at.Claim("share", r))
	control, err := plugintest.BuildMPSControl(dirs.Root)
	if err != nil {
		t.Fatal(err)
	}
	cfg := dirs.Config(machine, nodeName)
	cfg.MPSControl = control
	cfg.KubeClient = plugintest.FakeClient(nodeName, claims["share"])
	pidFiles := func() []string {
		files, _ := filepath.Glob(filepath.Join(cfg.MPSDir, "*", "*", "nvidia-cuda-mps-control.pid"))
		return files
	}
	p, err := plugintest.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Kubelet.PrepareOne(ctx, claims["share"]); err != nil {
		t.Fatal(err)
	}
	_ = p.Stop()

	if err := os.Remove(filepath.Join(dirs.PluginData, app.CheckpointFile)); err != nil {
		t.Fatal(err)
	}
	sim, err := dirs.SimState(machine, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.SetGPULost(0, true); err != nil {
		t.Fatal(err)
	}
	p, err = plugintest.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	if files := pidFiles(); len(files) != 1 {
		t.Errorf("the rebuilt share's MPS daemon was stopped: pid files %v", files)
	}
	cp, err := checkpoint.NewFileStore(filepath.Join(dirs.PluginData, app.CheckpointFile)).Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cp.All() {
		if pd := c.Devices[0]; pd.GPUUUID == "" || pd.Sharing == nil || len(pd.Sharing.Config) == 0 {
			t.Errorf("rebuilt device %+v lacks its GPU or sharing record", pd)
		}
	}
	if cp.Len() != 1 {
		t.Errorf("rebuilt checkpoint holds %d claims, want 1", cp.Len())
	}
}
