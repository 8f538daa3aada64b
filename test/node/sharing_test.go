package node

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	oci "github.com/opencontainers/runtime-spec/specs-go"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

func migClaim(name, profile string) *resourceapi.ResourceClaim {
	return at.Claim(name, at.Exactly("mig", "mig."+driverName, 1,
		`device.attributes["gpu.dra.dev"].parentMinor == 0`,
		fmt.Sprintf(`device.attributes["gpu.dra.dev"].profile == %q`, profile)))
}

// simState opens the simulated machine's persisted state, as the plugin
// left it, to check what exists on the "hardware".
func simState(t *testing.T, dirs pluginrun.Dirs) *nvmlsim.Machine {
	t.Helper()
	m, err := dirs.SimState(machine, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	t.Cleanup(func() { m.Shutdown() })
	return m
}

func TestPrepareDynamicMIG(t *testing.T) {
	ctx := context.Background()
	dirs, _, claims, start := setupClaims(t, migClaim("small", "1g.10gb"), migClaim("large", "3g.40gb"))
	p := start()
	defer func() { _ = p.Stop() }()

	for _, name := range []string{"small", "large"} {
		ids, err := p.Kubelet.PrepareOne(ctx, claims[name])
		if err != nil {
			t.Fatal(err)
		}
		spec := inject(t, dirs.CDI, ids)
		if uuid := env(spec, "NVIDIA_VISIBLE_DEVICES"); !strings.HasPrefix(uuid, "MIG-") {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, want a MIG UUID", name, uuid)
		}
		again, err := p.Kubelet.PrepareOne(ctx, claims[name])
		if err != nil || !slices.Equal(ids, again) {
			t.Errorf("%s: repeated prepare = %v, %v; want %v", name, again, err, ids)
		}
		caps := slices.IndexFunc(spec.Linux.Devices, func(d oci.LinuxDevice) bool { return strings.HasPrefix(d.Path, "/dev/nvidia-caps/nvidia-cap") })
		if caps < 0 || !slices.ContainsFunc(spec.Linux.Devices, func(d oci.LinuxDevice) bool { return d.Path == "/dev/nvidia0" }) {
			t.Errorf("%s: container lacks the parent GPU or MIG capability nodes: %v", name, devicePaths(spec))
		}
	}
	insts := simState(t, dirs).GpuInstances(0)
	var got []string
	for _, gi := range insts {
		got = append(got, fmt.Sprintf("%s@%d", gi.Profile, gi.Start))
		if len(gi.ComputeInstances) != 1 {
			t.Errorf("GPU instance %s@%d has %d compute instances, want 1", gi.Profile, gi.Start, len(gi.ComputeInstances))
		}
	}
	slices.Sort(got)
	// Small profiles fill from the top, large ones take the other end.
	if want := []string{"1g.10gb@6", "3g.40gb@0"}; !slices.Equal(got, want) {
		t.Errorf("instances on GPU 0 = %v, want %v", got, want)
	}

	for _, name := range []string{"small", "large"} {
		if err := p.Kubelet.UnprepareOne(ctx, claims[name]); err != nil {
			t.Fatal(err)
		}
	}
	if left := simState(t, dirs).GpuInstances(0); len(left) != 0 {
		t.Errorf("MIG instances left after unprepare: %+v", left)
	}
}

// A whole GPU allocated after MIG devices were released gets the GPU out of
// MIG mode.
func TestWholeGPUAfterMIG(t *testing.T) {
	ctx := context.Background()
	whole := at.Claim("whole", at.Exactly("gpu", driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`))
	dirs, _, claims, start := setupClaims(t, migClaim("mig", "1g.10gb"))
	p := start(whole)
	defer func() { _ = p.Stop() }()
	if _, err := p.Kubelet.PrepareOne(ctx, claims["mig"]); err != nil {
		t.Fatal(err)
	}
	if err := p.Kubelet.UnprepareOne(ctx, claims["mig"]); err != nil {
		t.Fatal(err)
	}
	// Allocated by hand: in a real cluster the scheduler allocates it
	// once the MIG claim is deallocated.
	whole.UID = "whole-uid"
	whole.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: driverName, Pool: nodeName, Device: "gpu-0"}},
	}}
	_ = p.Stop()
	p = start(whole)
	if _, err := p.Kubelet.PrepareOne(ctx, whole); err != nil {
		t.Fatal(err)
	}
	dev, _ := simState(t, dirs).DeviceGetHandleByIndex(0)
	if mode, _, ret := dev.GetMigMode(); ret != nvml.SUCCESS || mode != nvml.DEVICE_MIG_DISABLE {
		t.Errorf("MIG mode after preparing the whole GPU = %d (%v), want disabled", mode, ret)
	}
}

func TestPrepareTimeSlicing(t *testing.T) {
	ctx := context.Background()
	long := resourceapi.DeviceClaimConfiguration{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driverName, Parameters: runtime.RawExtension{
			Raw: []byte(`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`),
		}},
	}}
	tsClaim := func(name string) *resourceapi.ResourceClaim {
		c := at.Claim(name, at.Exactly("ts", "timeslice."+driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`))
		c.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{long}
		return c
	}
	dirs, _, claims, start := setupClaims(t, tsClaim("a"), tsClaim("b"))
	p := start()
	defer func() { _ = p.Stop() }()
	for _, name := range []string{"a", "b"} {
		if _, err := p.Kubelet.PrepareOne(ctx, claims[name]); err != nil {
			t.Fatal(err)
		}
	}
	if claims["a"].Status.Allocation.Devices.Results[0].Device != claims["b"].Status.Allocation.Devices.Results[0].Device {
		t.Fatalf("both shares should be on gpu-0-ts")
	}
	if level := simState(t, dirs).Timeslice(0); level != 3 {
		t.Errorf("time-slice level with two Long shares = %d, want 3", level)
	}
	for _, name := range []string{"a", "b"} {
		if err := p.Kubelet.UnprepareOne(ctx, claims[name]); err != nil {
			t.Fatal(err)
		}
	}
	if level := simState(t, dirs).Timeslice(0); level != 0 {
		t.Errorf("time-slice level after the last share = %d, want restored to 0", level)
	}
}

func TestPrepareMPS(t *testing.T) {
	ctx := context.Background()
	mpsClaim := func(name string) *resourceapi.ResourceClaim {
		r := at.Exactly("mps", "mps."+driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`)
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"compute": resource.MustParse("50"), "memory": resource.MustParse("20Gi"),
		}}
		return at.Claim(name, r)
	}
	dirs, _, claims, _ := setupClaims(t, mpsClaim("a"), mpsClaim("b"))
	control, err := pluginrun.BuildMPSControl(dirs.Root)
	if err != nil {
		t.Fatal(err)
	}
	cfg := dirs.Config(machine, nodeName)
	cfg.MPSControl = control
	cfg.KubeClient = apiserver.NodeClient(nodeName, claims["a"], claims["b"])
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()

	for _, name := range []string{"a", "b"} {
		ids, err := p.Kubelet.PrepareOne(ctx, claims[name])
		if err != nil {
			t.Fatal(err)
		}
		spec := inject(t, dirs.CDI, ids)
		pipe := env(spec, "CUDA_MPS_PIPE_DIRECTORY")
		if pipe == "" || env(spec, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") != "50" || env(spec, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") != "0=20480M" {
			t.Errorf("%s: MPS env = %v", name, spec.Process.Env)
		}
		if !slices.ContainsFunc(spec.Mounts, func(m oci.Mount) bool { return m.Destination == pipe }) {
			t.Errorf("%s: the MPS pipe directory %s is not mounted: %+v", name, pipe, spec.Mounts)
		}
	}
	dev, _ := simState(t, dirs).DeviceGetHandleByIndex(0)
	if mode, ret := dev.GetComputeMode(); ret != nvml.SUCCESS || mode != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("compute mode under MPS = %v (%v), want EXCLUSIVE_PROCESS", mode, ret)
	}
	daemons, _ := filepath.Glob(filepath.Join(cfg.MPSDir, "*", "*", "nvidia-cuda-mps-control.pid"))
	if len(daemons) != 1 {
		t.Errorf("want one MPS control daemon for the GPU, found pid files %v", daemons)
	}

	for _, name := range []string{"a", "b"} {
		if err := p.Kubelet.UnprepareOne(ctx, claims[name]); err != nil {
			t.Fatal(err)
		}
	}
	if daemons, _ := filepath.Glob(filepath.Join(cfg.MPSDir, "*", "*", "nvidia-cuda-mps-control.pid")); len(daemons) != 0 {
		t.Errorf("MPS daemon still running after the last share: %v", daemons)
	}
	dev, _ = simState(t, dirs).DeviceGetHandleByIndex(0)
	if mode, _ := dev.GetComputeMode(); mode != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("compute mode after the last MPS share = %v, want DEFAULT restored", mode)
	}
}

// A MIG device created out of band is handed out as is and never destroyed.
func TestStaticMIGIsNeverDestroyed(t *testing.T) {
	ctx := context.Background()
	dirs, err := pluginrun.NewDirs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The admin partitions GPU 2 before the plugin starts (mig-parted).
	pre := simState(t, dirs)
	dev, _ := pre.DeviceGetHandleByIndex(2)
	inst, err := mig.Create(ctx, dev, 9, mig.Placement{Start: 0, Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("gpu-2-mig-gi%d-ci%d", inst.GIID, inst.CIID)
	claim := at.Claim("static", at.Exactly("mig", "mig."+driverName, 1))
	claim.UID = "static-uid"
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "mig", Driver: driverName, Pool: nodeName, Device: name}},
	}}
	cfg := dirs.Config(machine, nodeName)
	cfg.KubeClient = apiserver.NodeClient(nodeName, claim)
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	ids, err := p.Kubelet.PrepareOne(ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	if got := env(inject(t, dirs.CDI, ids), "NVIDIA_VISIBLE_DEVICES"); got != inst.UUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want the static instance %s", got, inst.UUID)
	}
	if err := p.Kubelet.UnprepareOne(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if left := simState(t, dirs).GpuInstances(2); len(left) != 1 {
		t.Errorf("static MIG instance destroyed: %+v", left)
	}
}
