package kubectlgpu_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/golden"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const timeSlicing = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}`

// passthroughCluster is a DGX H100 whose device policy publishes every GPU
// for passthrough (gpu-N-vfio), allocated by the upstream allocator:
//
//	gpu-0: passed through to vms/vm
//	gpu-1: a whole GPU (its passthrough device stays free)
//	gpu-3: passed through to vms/vm-shared, with a sharing config that
//	       does not apply to it
func passthroughCluster(t *testing.T) *fixture {
	t.Helper()
	on := true
	n := simnode.New(t, "dgxh100", "node-a")
	n.Resources = devicemodel.Build(n.GPUs, devicemodel.Options{NodeName: n.Name,
		Policy: devicemodel.Policy{Default: devicemodel.GPUPolicy{Passthrough: &on}}})
	f := newFixture(t)
	f.addNode(n)
	f.run("node-a", "vms", at.Claim("vm", onGPU(0, "vfio")))
	f.run("node-a", "default", at.Claim("train", onGPU(1, "gpu")))
	f.run("node-a", "vms", withConfig(at.Claim("vm-shared", onGPU(3, "vfio")), timeSlicing))
	return f
}

func TestPassthrough(t *testing.T) {
	f := passthroughCluster(t)
	client := f.client()
	decode := func(t *testing.T, out string, v any) {
		t.Helper()
		if err := json.Unmarshal([]byte(out), v); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		cmd    command
		output string
		// want are lines (or parts of one) the text output has; golden,
		// if set, is the file in testdata it is (docs/kubectl-gpu.md shows
		// it).
		want   []string
		golden string
		// check inspects -o json instead.
		check func(t *testing.T, out string)
	}{
		{
			name: "nodes", cmd: nodes(), golden: "nodes-passthrough.golden",
			want: []string{"gpu-0 passthrough (vms/vm); gpu-1 whole; gpu-3 passthrough (vms/vm-shared)",
				"3 of 8 GPUs: 1 whole, 2 passthrough"},
		},
		{
			name: "nodes wide", cmd: nodes(), output: "wide",
			want: []string{"gpu-0 passthrough [vms/vm]; gpu-1 whole [default/train]; gpu-3 passthrough [vms/vm-shared]"},
		},
		{
			name: "nodes json", cmd: nodes(),
			check: func(t *testing.T, out string) {
				var l kubectlgpu.NodeList
				decode(t, out, &l)
				n := l.Nodes[0]
				if n.Free != 5 || n.Claims != 3 || l.Total.Passthrough != 2 || l.Total.Whole != 1 || l.Total.Free != 5 {
					t.Errorf("free %d, claims %d, total %+v", n.Free, n.Claims, l.Total)
				}
				want := kubectlgpu.Usage{State: kubectlgpu.StatePassthrough, Passthrough: []string{"vms/vm"}, Claims: []string{"vms/vm"}}
				if diff := cmp.Diff(want, n.GPUs[0].Usage); diff != "" {
					t.Errorf("gpu-0 usage (-want +got):\n%s", diff)
				}
				if u := n.GPUs[1].Usage; u.State != kubectlgpu.StateWhole || u.Passthrough != nil {
					t.Errorf("gpu-1 usage %+v, want whole", u)
				}
			},
		},
		{
			name: "node", cmd: node("node-a"),
			want: []string{
				"gpu-0   passthrough (vms/vm)",
				"gpu-0-vfio; unavailable (passthrough): gpu-0 gpu-0-ts gpu-0-mps +25 MIG",
				"gpu-1   whole ",
				"gpu-1 gpu-1-ts gpu-1-mps gpu-1-vfio +25 MIG",
				"gpu-0   gpu-0-vfio (passthrough)   vms/vm ",
				"gpu-0   none (passed through)",
			},
		},
		{
			name: "node json", cmd: node("node-a"),
			check: func(t *testing.T, out string) {
				var d kubectlgpu.NodeDetail
				decode(t, out, &d)
				g0 := d.GPUs[0]
				if len(g0.Devices) != 29 || g0.FreeMIG != nil {
					t.Errorf("gpu-0: %d devices, free MIG %v; want 29, none", len(g0.Devices), g0.FreeMIG)
				}
				for _, dev := range g0.Devices {
					var want *kubectlgpu.Unavailable
					if dev.Name != "gpu-0-vfio" {
						want = &kubectlgpu.Unavailable{Reason: "passthrough", Claims: []string{"vms/vm"}}
					} else if dev.Type != vocabulary.KindVFIO || dev.Allocations != 1 {
						t.Errorf("gpu-0-vfio: %+v", dev)
					}
					if diff := cmp.Diff(want, dev.Unavailable); diff != "" {
						t.Errorf("%s unavailable (-want +got):\n%s", dev.Name, diff)
					}
				}
				if len(g0.Holders) != 1 || g0.Holders[0].Device != "gpu-0-vfio" || g0.Holders[0].Type != vocabulary.KindVFIO {
					t.Errorf("gpu-0 holders %+v", g0.Holders)
				}
				for _, g := range d.GPUs[1:] {
					for _, dev := range g.Devices {
						if dev.Unavailable != nil && g.Name != "gpu-3" {
							t.Errorf("%s unavailable: %+v", dev.Name, dev.Unavailable)
						}
					}
				}
				if d.GPUs[2].FreeMIG == nil {
					t.Error("gpu-2 is free but has no free MIG placements")
				}
			},
		},
		{
			name: "claims", cmd: claims("vms"), golden: "claims-passthrough.golden",
			want: []string{
				"vm          allocated,reserved   node-a   vm          gpu-0-vfio (passthrough)   Exclusive (default)",
				"gpu-3-vfio (passthrough)   invalid (claim): a whole GPU is allocated exclusively: sharing strategy TimeSlicing is not supported for it",
			},
		},
		{
			name: "claims json", cmd: claims("vms"),
			check: func(t *testing.T, out string) {
				var l kubectlgpu.ClaimList
				decode(t, out, &l)
				if len(l.Claims) != 2 {
					t.Fatalf("%d claims in vms, want 2", len(l.Claims))
				}
				a := l.Claims[0].Devices[0]
				if a.Type != vocabulary.KindVFIO || a.GPU != "gpu-0" || a.Config.Error != "" || l.Claims[0].Node != "node-a" {
					t.Errorf("vm: %+v on %s", a, l.Claims[0].Node)
				}
				if e := l.Claims[1].Devices[0].Config.Error; !strings.Contains(e, "TimeSlicing is not supported") {
					t.Errorf("vm-shared config error %q", e)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.check != nil {
				tc.check(t, mustRun(t, client, tc.cmd, "json"))
				return
			}
			out := mustRun(t, client, tc.cmd, tc.output)
			if tc.golden != "" {
				golden.Check(t, "testdata/"+tc.golden, []byte(out))
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
