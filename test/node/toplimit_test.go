package node

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
)

// TestTopLimitMPS: the plugin reports the memory limit each share's
// containers get, and kubectl gpu top shows it: an MPS share whose config
// pins 8Gi of its 20Gi capacity shows 8Gi (the limit its clients get),
// one without such a config its 20Gi capacity, a time-slice share its
// 12Gi capacity.
func TestTopLimitMPS(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	share := func(name, class string, memory string) *resourceapi.ResourceClaim {
		r := at.Exactly(class, class+"."+driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`)
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(memory),
		}}
		return at.Claim(name, r)
	}
	pinned := share("pinned", "mps", "20Gi")
	pinned.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driverName, Parameters: runtime.RawExtension{
			Raw: []byte(`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"8Gi"}}}`),
		}},
	}}}
	dirs, _, claims, _ := setupClaims(t, pinned, share("capacity", "mps", "20Gi"))
	control, err := pluginrun.BuildMPSControl(dirs.Root)
	if err != nil {
		t.Fatal(err)
	}
	cfg := dirs.Config(machine, nodeName)
	cfg.MPSControl = control
	cfg.KubeClient = apiserver.NodeClient(nodeName, claims["pinned"], claims["capacity"])
	p := startWithMetrics(ctx, t, cfg)
	for _, name := range []string{"pinned", "capacity"} {
		if _, err := p.Kubelet.PrepareOne(ctx, claims[name]); err != nil {
			t.Fatalf("prepare %s: %v", name, err)
		}
	}
	checkLimits(t, cfg.LocalMetricsAddress, map[string]int64{"pinned": 8 << 30, "capacity": 20 << 30})
	for _, name := range []string{"pinned", "capacity"} {
		if err := p.Kubelet.UnprepareOne(ctx, claims[name]); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTopLimitTS (a short name: the simulated driver's socket path must fit
// in 108 bytes): a time-slice share's limit is its memory
// capacity.
func TestTopLimitTS(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := at.Exactly("ts", "timeslice."+driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`)
	r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		"memory": resource.MustParse("12Gi"),
	}}
	dirs, _, claims, _ := setupClaims(t, at.Claim("ts", r))
	cfg := dirs.Config(machine, nodeName)
	cfg.KubeClient = apiserver.NodeClient(nodeName, claims["ts"])
	p := startWithMetrics(ctx, t, cfg)
	if _, err := p.Kubelet.PrepareOne(ctx, claims["ts"]); err != nil {
		t.Fatal(err)
	}
	checkLimits(t, cfg.LocalMetricsAddress, map[string]int64{"ts": 12 << 30})
}

// checkLimits checks that top's rows of the plugin's local metrics, once
// served, show each claim's limit.
func checkLimits(t *testing.T, addr string, want map[string]int64) {
	t.Helper()
	var body string
	eventually(t, 20*time.Second, "the plugin's local metrics", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && resp.StatusCode == http.StatusOK
	})
	rows, err := kubectlgpu.ParseTop([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, r := range rows {
		if r.Claim != "" {
			got[r.Claim] = r.MemoryLimitBytes
		}
	}
	for claim, limit := range want {
		if got[claim] != limit {
			t.Errorf("claim %s: top's memory limit %d, want %d (rows %+v)\nmetrics:\n%s", claim, got[claim], limit, rows, grepLines(body, "gpu_dra_container_memory_limit_bytes"))
		}
	}
}

// grepLines are the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
