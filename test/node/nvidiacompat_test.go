package node

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// nvidiaConfig is an opaque config addressed to NVIDIA's driver name.
func nvidiaConfig(params string, requests ...string) resourceapi.DeviceClaimConfiguration {
	return resourceapi.DeviceClaimConfiguration{Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: vocabulary.NVIDIADriverName, Parameters: runtime.RawExtension{Raw: []byte(params)}},
	}}
}

// The plugin run under NVIDIA's driver name (the chart's compat.nvidia)
// prepares claims written for NVIDIA's driver: its class names, its CEL
// over device.attributes["gpu.nvidia.com"], and its resource.nvidia.com
// configs, applied through this driver's strategies.
func TestNVIDIACompatPrepare(t *testing.T) {
	ctx := context.Background()
	const nv = vocabulary.NVIDIADriverName
	// NVIDIA's quickstart gpu-test4 and gpu-test6 select like this.
	mig := at.Claim("mig-mps", at.Exactly("mig", "mig.nvidia.com", 1,
		`device.attributes['gpu.nvidia.com'].profile == '3g.40gb'`,
		`device.attributes['gpu.nvidia.com'].parentUUID != ''`))
	mig.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{nvidiaConfig(
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":40,"defaultPinnedDeviceMemoryLimit":"10Gi"}}}`)}
	whole := at.Claim("whole", at.Exactly("gpu", "gpu.nvidia.com", 1,
		`device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*h100.*$') && device.attributes['gpu.nvidia.com'].index == 2`))
	whole.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{nvidiaConfig(
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"}`, "gpu")}

	// NVIDIA's quickstart gpu-test6: time-slicing a whole GPU for the
	// containers of one claim, which this driver refuses with the reason.
	sliced := at.Claim("sliced", at.Exactly("gpu", "gpu.nvidia.com", 1))
	sliced.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{nvidiaConfig(
		`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`, "gpu")}

	dirs, _, claims, _ := setupClaimsFor(t, nv, mig, whole, sliced)
	control, err := pluginrun.BuildMPSControl(dirs.Root)
	if err != nil {
		t.Fatal(err)
	}
	cfg := dirs.Config(machine, nodeName)
	cfg.DriverName = nv
	cfg.MPSControl = control
	cfg.KubeClient = apiserver.NodeClient(nodeName, claims["mig-mps"], claims["whole"], claims["sliced"])
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()

	ids, err := p.Kubelet.PrepareOne(ctx, claims["mig-mps"])
	if err != nil {
		t.Fatal(err)
	}
	spec := inject(t, dirs.CDI, ids)
	if uuid := env(spec, "NVIDIA_VISIBLE_DEVICES"); !strings.HasPrefix(uuid, "MIG-") {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want a MIG UUID", uuid)
	}
	if got := env(spec, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); got != "40" {
		t.Errorf("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%q, want NVIDIA's config's 40", got)
	}
	if got := env(spec, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"); got != "0=10240M" {
		t.Errorf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q, want 0=10240M from NVIDIA's config's 10Gi", got)
	}

	ids, err = p.Kubelet.PrepareOne(ctx, claims["whole"])
	if err != nil {
		t.Fatal(err)
	}
	if uuid := env(inject(t, dirs.CDI, ids), "NVIDIA_VISIBLE_DEVICES"); !strings.HasPrefix(uuid, "GPU-") {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want the GPU's UUID", uuid)
	}
	_, err = p.Kubelet.PrepareOne(ctx, claims["sliced"])
	if err == nil || !strings.Contains(err.Error(), `sharing strategy "TimeSlicing" is not supported for it`) ||
		!strings.Contains(err.Error(), "timeslice.<driver name>") {
		t.Errorf("time-slicing a whole GPU: err %v, want it refused with what serves instead", err)
	}
	for _, name := range []string{"mig-mps", "whole"} {
		if err := p.Kubelet.UnprepareOne(ctx, claims[name]); err != nil {
			t.Errorf("unprepare %s: %v", name, err)
		}
	}
}
