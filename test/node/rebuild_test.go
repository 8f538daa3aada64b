package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// A checkpoint rebuilt from the CDI specs keeps an MPS share's daemon, also
// when the share's GPU is lost at that start: the spec names the GPU and the
// sharing record, so the MPS manager still counts the share as live.
func TestRebuildKeepsShare(t *testing.T) {
	ctx := context.Background()
	dirs, cfg, claims := setupMPSShare(t)
	pidFiles := func() []string {
		files, _ := filepath.Glob(filepath.Join(cfg.MPSDir, "*", "*", "nvidia-cuda-mps-control.pid"))
		return files
	}
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Kubelet.PrepareOne(ctx, claims["share"]); err != nil {
		t.Fatal(err)
	}
	_ = p.Stop()

	if err := os.Remove(filepath.Join(dirs.PluginData, nodeplugin.CheckpointFile)); err != nil {
		t.Fatal(err)
	}
	sim, err := dirs.SimState(machine, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.SetGPULost(0, true); err != nil {
		t.Fatal(err)
	}
	p, err = inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	if files := pidFiles(); len(files) != 1 {
		t.Errorf("the rebuilt share's MPS daemon was stopped: pid files %v", files)
	}
	cp, err := checkpoint.NewFileStore(filepath.Join(dirs.PluginData, nodeplugin.CheckpointFile)).Load(ctx)
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

// A prepared claim's CDI spec corrupted or deleted while the plugin is down
// is written again at start also when the claim's GPU is lost at that start
// (the device is not published): the checkpoint records the device nodes.
// A checkpoint then rebuilt from that rewritten spec, with the GPU still
// lost, keeps the claim and can write its spec again.
func TestRewriteSpecOfLostGPU(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(path string) error
	}{
		{"corrupt", func(path string) error { return os.WriteFile(path, []byte(`{"cdiVersion": "0.6.0", "kind": `), 0o644) }},
		{"deleted", os.Remove},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dirs, _, claims, start := setupClaims(t,
				at.Claim("mig", at.Exactly("mig", "mig."+driverName, 1,
					`device.attributes["gpu.dra.dev"].parentMinor == 0`, `device.attributes["gpu.dra.dev"].profile == "1g.10gb"`)),
				at.Claim("whole", at.Exactly("gpus", driverName, 1, `device.attributes["gpu.dra.dev"].minor == 1`)))
			p := start()
			ids := map[string][]string{}
			for _, name := range []string{"mig", "whole"} {
				got, err := p.Kubelet.PrepareOne(ctx, claims[name])
				if err != nil {
					t.Fatalf("prepare %s: %v", name, err)
				}
				ids[name] = got
			}
			_ = p.Stop()

			sim, err := dirs.SimState(machine, nodeName)
			if err != nil {
				t.Fatal(err)
			}
			for _, gpu := range []int{0, 1} {
				if err := sim.SetGPULost(gpu, true); err != nil {
					t.Fatal(err)
				}
			}
			damage := func(rm func(string) error) {
				t.Helper()
				for _, name := range []string{"mig", "whole"} {
					files := specFiles(t, dirs.CDI, claims[name])
					if len(files) != 1 {
						t.Fatalf("claim %s has spec files %v, want one", name, files)
					}
					if err := rm(files[0]); err != nil {
						t.Fatal(err)
					}
				}
			}
			check := func(when string) {
				t.Helper()
				for _, name := range []string{"mig", "whole"} {
					if files := specFiles(t, dirs.CDI, claims[name]); len(files) != 1 {
						t.Fatalf("%s: claim %s has spec files %v, want one", when, name, files)
					}
					if spec := inject(t, dirs.CDI, ids[name]); len(devicePaths(spec)) == 0 {
						t.Errorf("%s: claim %s's rewritten spec gives no device nodes", when, name)
					}
				}
			}

			damage(tc.damage)
			p = start()
			_ = p.Stop()
			check("after restart with a damaged spec")

			// Now lose the checkpoint and damage the specs again: the
			// rebuilt checkpoint must still know how to write them.
			if err := os.Remove(filepath.Join(dirs.PluginData, nodeplugin.CheckpointFile)); err != nil {
				t.Fatal(err)
			}
			p = start()
			_ = p.Stop()
			damage(tc.damage)
			p = start()
			defer func() { _ = p.Stop() }()
			check("after rebuilding the checkpoint and damaging the specs again")
		})
	}
}

// A GPU whose MPS daemon is stopped at start while the GPU is lost (its
// share is gone: checkpoint and spec deleted) cannot get its compute mode
// back then; once the GPU is back, the next kubelet call finishes the
// teardown instead of leaving it in EXCLUSIVE_PROCESS without shares.
func TestMPSTeardownFinishesWhenGPUBack(t *testing.T) {
	ctx := context.Background()
	dirs, cfg, claims := setupMPSShare(t)
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Kubelet.PrepareOne(ctx, claims["share"]); err != nil {
		t.Fatal(err)
	}
	_ = p.Stop()

	if err := os.Remove(filepath.Join(dirs.PluginData, nodeplugin.CheckpointFile)); err != nil {
		t.Fatal(err)
	}
	for _, f := range specFiles(t, dirs.CDI, claims["share"]) {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	sim, err := dirs.SimState(machine, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.SetGPULost(0, true); err != nil {
		t.Fatal(err)
	}
	var live *nvmlsim.Machine
	cfg.SimulationHook = func(m *nvmlsim.Machine) { live = m }
	p, err = inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	if err := live.SetGPULost(0, false); err != nil {
		t.Fatal(err)
	}
	// Any call: the kubelet unprepares the claim it still thinks prepared.
	if err := p.Kubelet.UnprepareOne(ctx, claims["share"]); err != nil {
		t.Fatal(err)
	}
	dev, _ := simState(t, dirs).DeviceGetHandleByIndex(0)
	if mode, ret := dev.GetComputeMode(); ret != nvml.SUCCESS || mode != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("compute mode of GPU 0 without MPS shares = %v (%v), want DEFAULT", mode, ret)
	}
}

// setupMPSShare allocates one MPS share of GPU 0 ("share") and configures a
// plugin that can run its daemon.
func setupMPSShare(t *testing.T) (pluginrun.Dirs, *nodeplugin.Config, map[string]*resourceapi.ResourceClaim) {
	t.Helper()
	r := at.Exactly("mps", "mps."+driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`)
	r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		"compute": resource.MustParse("50"), "memory": resource.MustParse("20Gi"),
	}}
	dirs, _, claims, _ := setupClaims(t, at.Claim("share", r))
	control, err := pluginrun.BuildMPSControl(dirs.Root)
	if err != nil {
		t.Fatal(err)
	}
	cfg := dirs.Config(machine, nodeName)
	cfg.MPSControl = control
	cfg.KubeClient = apiserver.NodeClient(nodeName, claims["share"])
	return dirs, cfg, claims
}
