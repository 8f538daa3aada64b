package node

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	oci "github.com/opencontainers/runtime-spec/specs-go"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
)

// A MIG device whose MigDeviceConfig asks for MPS gets its own MPS control
// daemon on the MIG device, and its containers the MPS environment; the
// daemon survives a plugin restart and goes before the instance does.
func TestPrepareMPSInsideMIG(t *testing.T) {
	ctx := context.Background()
	claim := migClaim("mig-mps", "3g.40gb")
	claim.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driverName, Parameters: runtime.RawExtension{
			Raw: []byte(`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":40}}}`),
		}},
	}}}
	dirs, _, claims, _ := setupClaims(t, claim)
	control, err := pluginrun.BuildMPSControl(dirs.Root)
	if err != nil {
		t.Fatal(err)
	}
	cfg := dirs.Config(machine, nodeName)
	cfg.MPSControl = control
	cfg.KubeClient = apiserver.NodeClient(nodeName, claims["mig-mps"])
	start := func() *inprocess.Plugin {
		t.Helper()
		p, err := inprocess.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	pidFiles := func() []string {
		files, _ := filepath.Glob(filepath.Join(cfg.MPSDir, "*", "*", "nvidia-cuda-mps-control.pid"))
		return files
	}
	p := start()
	defer func() { _ = p.Stop() }()

	ids, err := p.Kubelet.PrepareOne(ctx, claims["mig-mps"])
	if err != nil {
		t.Fatal(err)
	}
	spec := inject(t, dirs.CDI, ids)
	uuid := env(spec, "NVIDIA_VISIBLE_DEVICES")
	if !strings.HasPrefix(uuid, "MIG-") {
		t.Fatalf("NVIDIA_VISIBLE_DEVICES=%q, want a MIG UUID", uuid)
	}
	pipe := env(spec, "CUDA_MPS_PIPE_DIRECTORY")
	if pipe == "" || env(spec, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") != "40" {
		t.Errorf("MPS env of the MIG device's container = %v", spec.Process.Env)
	}
	if !slices.ContainsFunc(spec.Mounts, func(m oci.Mount) bool { return m.Destination == pipe }) {
		t.Errorf("the MPS pipe directory %q is not mounted into the container", pipe)
	}
	if files := pidFiles(); len(files) != 1 {
		t.Errorf("want one MPS daemon; pid files %v", files)
	} else if state, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(files[0])), "state.json")); err != nil || !strings.Contains(string(state), uuid) {
		t.Errorf("the MPS daemon's state does not name the MIG device %s: %s (%v)", uuid, state, err)
	}
	// MPS inside a MIG device leaves the parent GPU's compute mode alone.
	dev, _ := simState(t, dirs).DeviceGetHandleByIndex(0)
	if mode, ret := dev.GetComputeMode(); ret != nvml.SUCCESS || mode != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("parent GPU compute mode = %v (%v), want DEFAULT", mode, ret)
	}

	// A restart adopts the daemon (reconcile must count it as live).
	_ = p.Stop()
	p = start()
	if files := pidFiles(); len(files) != 1 {
		t.Errorf("MPS daemon of the MIG device gone after a plugin restart: pid files %v", files)
	}

	if err := p.Kubelet.UnprepareOne(ctx, claims["mig-mps"]); err != nil {
		t.Fatal(err)
	}
	if files := pidFiles(); len(files) != 0 {
		t.Errorf("MPS daemon still running after unprepare: %v", files)
	}
	if left := simState(t, dirs).GpuInstances(0); len(left) != 0 {
		t.Errorf("MIG instances left after unprepare: %+v", left)
	}
}
