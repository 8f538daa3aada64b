package kubectlgpu_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	resourceapi "k8s.io/api/resource/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/golden"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

func TestNodeGolden(t *testing.T) {
	golden.Check(t, "testdata/node-a.golden", []byte(mustRun(t, standardCluster(t).client(), node("node-a"), "")))
}

func nodeDetail(t *testing.T, f *fixture, name string) kubectlgpu.NodeDetail {
	t.Helper()
	var d kubectlgpu.NodeDetail
	if err := json.Unmarshal([]byte(mustRun(t, f.client(), node(name), "json")), &d); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestNodeDetail(t *testing.T) {
	d := nodeDetail(t, standardCluster(t), "node-a")
	if d.Kind != kubectlgpu.KindNode || d.Name != "node-a" || len(d.GPUs) != 8 || d.Devices != 224 {
		t.Fatalf("node-a: kind %s, %d GPUs, %d devices", d.Kind, len(d.GPUs), d.Devices)
	}
	g0 := d.GPUs[0]
	if g0.Name != "gpu-0" || g0.ProductName != "NVIDIA H100 80GB HBM3" || !strings.HasPrefix(g0.UUID, "GPU-") ||
		g0.PCIBusID == "" || g0.NUMANode == nil || *g0.NUMANode != 0 || g0.NVLinkDomain == "" || !g0.MIGCapable {
		t.Errorf("gpu-0 identity %+v", g0.GPUStatus)
	}
	if len(g0.Devices) != 28 || g0.Devices[0].Name != "gpu-0" || g0.Devices[1].Name != "gpu-0-ts" || g0.Devices[2].Name != "gpu-0-mps" {
		t.Errorf("gpu-0 has %d devices, first %v", len(g0.Devices), g0.Devices[:3])
	}
	if n := g0.Devices[1].Allocations; n != 2 {
		t.Errorf("gpu-0-ts has %d allocations, want 2", n)
	}
	var holders []string
	for _, h := range g0.Holders {
		holders = append(holders, fmt.Sprintf("%s/%s %s %v %s", h.Namespace, h.Claim, h.Device, h.Pods[0].Name, h.Config.Summary))
	}
	want := []string{
		"default/ts-a gpu-0-ts ts-a TimeSlicing, interval Long",
		"default/ts-b gpu-0-ts ts-b TimeSlicing",
	}
	if diff := cmp.Diff(want, holders); diff != "" {
		t.Errorf("gpu-0 holders (-want +got):\n%s", diff)
	}
	g3 := d.GPUs[3]
	var migHolders []string
	for _, h := range g3.Holders {
		migHolders = append(migHolders, h.Claim+"="+h.Profile)
	}
	if diff := cmp.Diff([]string{"mig-small-1=1g.10gb", "mig-small-2=1g.10gb", "mig-medium=3g.40gb"}, migHolders); diff != "" {
		t.Errorf("gpu-3 holders (-want +got):\n%s", diff)
	}
	// 1g at slices 6 and 5 and a 3g at 0-3 leave slice 4: one 1g of each kind.
	wantFree := []kubectlgpu.FreeMIG{
		{Profile: "1g.10gb", Placements: []int64{4}, Devices: []string{"gpu-3-mig-1g10gb-4"}},
		{Profile: "1g.10gb+me", Placements: []int64{4}, Devices: []string{"gpu-3-mig-1g10gb-me-4"}},
	}
	if diff := cmp.Diff(wantFree, g3.FreeMIG); diff != "" {
		t.Errorf("gpu-3 free MIG (-want +got):\n%s", diff)
	}
	for _, i := range []int{0, 1, 2, 4} {
		if len(d.GPUs[i].FreeMIG) != 0 {
			t.Errorf("%s is used whole or shared but lists free MIG placements %v", d.GPUs[i].Name, d.GPUs[i].FreeMIG)
		}
	}
}

func TestNodeTable(t *testing.T) {
	out := mustRun(t, standardCluster(t).client(), node("node-a"), "")
	for _, want := range []string{
		"GPUs:     8× NVIDIA H100 80GB HBM3, 3 free",
		"gpu-0 gpu-0-ts gpu-0-mps +25 MIG",
		"gpu-0-ts (timeslice: shares 1, compute 25%, memory 19.9Gi)   default/ts-a",
		"gpu-4-mps (mps: shares 1, compute 50%, memory 20Gi)",
		"MPS, threads 50% (claim)",
		"gpu-3   1g.10gb: 4   1g.10gb+me: 4",
		"gpu-5   all (GPU free)",
		"gpu-7   all (GPU free) (tainted: gpu.dra.dev/unhealthy=XID79-reboot-required:NoExecute)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("node-a lacks %q:\n%s", want, out)
		}
	}
	wide := mustRun(t, standardCluster(t).client(), node("node-a"), "wide")
	for _, want := range []string{"ts-a (Running)", "00000000-0000-4000-8000-000000000001", "Hopper",
		"gpu-5   1g.10gb: 0-6   1g.10gb+me: 0-6   1g.20gb: 0,2,4,6   2g.20gb: 0,2,4   3g.40gb: 0,4   4g.40gb: 0   7g.80gb: 0"} {
		if !strings.Contains(wide, want) {
			t.Errorf("node-a -o wide lacks %q:\n%s", want, wide)
		}
	}
}

func TestNodeNotFound(t *testing.T) {
	_, _, err := kubectlGPU(t, standardCluster(t).client(), node("node-z"), "")
	if err == nil || !strings.Contains(err.Error(), `node "node-z" publishes no GPUs of the gpu.dra.dev driver`) {
		t.Errorf("got %v", err)
	}
}

// The free placements are exactly those the scheduler's allocator can
// still allocate, whatever holds the GPU.
func TestFreeMIGPlacementsMatchTheAllocator(t *testing.T) {
	tests := map[string][]resourceapi.DeviceRequest{
		"nothing":              nil,
		"one 1g.10gb":          {onGPU(0, "mig", at.Profile("1g.10gb"))},
		"1g.10gb+me":           {onGPU(0, "mig", at.Profile("1g.10gb+me"))},
		"3g.40gb and two 1g":   {onGPU(0, "mig", at.Profile("3g.40gb")), onGPU(0, "mig", at.Profile("1g.10gb")), onGPU(0, "mig", at.Profile("1g.10gb"))},
		"4g.40gb and 2g.20gb":  {onGPU(0, "mig", at.Profile("4g.40gb")), onGPU(0, "mig", at.Profile("2g.20gb"))},
		"whole GPU":            {onGPU(0, "gpu")},
		"a time-slice share":   {onGPU(0, "timeslice")},
		"seven 1g.10gb (full)": slices.Repeat([]resourceapi.DeviceRequest{onGPU(0, "mig", at.Profile("1g.10gb"))}, 7),
	}
	for name, held := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, "node-a=dgxh100")
			for i, r := range held {
				f.run("node-a", "default", at.Claim(fmt.Sprintf("held-%d", i), r))
			}
			g := nodeDetail(t, f, "node-a").GPUs[0]
			free := map[string]bool{}
			for _, fm := range g.FreeMIG {
				for _, dev := range fm.Devices {
					free[dev] = true
				}
			}
			for _, dev := range g.Devices {
				if dev.Type != vocabulary.KindMIG {
					continue
				}
				claim := at.Claim("probe", onGPU(0, "mig", at.Profile(dev.Profile),
					fmt.Sprintf(`device.attributes["gpu.dra.dev"].placementStart == %d`, *dev.PlacementStart)))
				out, err := f.allocator().Allocate(context.Background(), "node-a", claim)
				if err != nil {
					t.Fatal(err)
				}
				if fits := out != nil; fits != free[dev.Name] {
					t.Errorf("%s: allocator fits=%v, kubectl gpu free=%v", dev.Name, fits, free[dev.Name])
				}
				if out != nil {
					f.allocator().Release(out[0])
				}
			}
		})
	}
}

// After one 1g.10gb (placed at the top, slice 6) the rest of the GPU stays
// usable: everything that avoids slice 6.
func TestFreeMIGPlacementsAfterOne1g(t *testing.T) {
	f := newFixture(t, "node-a=dgxh100")
	f.run("node-a", "default", at.Claim("small", onGPU(0, "mig", at.Profile("1g.10gb"))))
	got := map[string][]int64{}
	for _, fm := range nodeDetail(t, f, "node-a").GPUs[0].FreeMIG {
		got[fm.Profile] = fm.Placements
	}
	want := map[string][]int64{
		"1g.10gb":    {0, 1, 2, 3, 4, 5},
		"1g.10gb+me": {0, 1, 2, 3, 4, 5},
		"1g.20gb":    {0, 2, 4},
		"2g.20gb":    {0, 2, 4},
		"3g.40gb":    {0},
		"4g.40gb":    {0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("free placements (-want +got):\n%s", diff)
	}
}

// A GPU partitioned out of band publishes only its static MIG devices:
// no whole GPU, no counters. They are free until allocated.
func TestStaticMIG(t *testing.T) {
	n, inst := simnode.WithStaticMIG(t, simnode.New(t, "dgxa100", "node-s"), 3, 9, mig.Placement{Start: 4, Size: 4}) // 3g.20gb
	f := &fixture{t: t, classes: deviceclass.DeviceClasses(driverName)}
	for i, s := range n.Slices(driverName) {
		s.Name = fmt.Sprintf("%s%c", s.GenerateName, 'a'+i)
		f.slices = append(f.slices, s)
	}
	name := fmt.Sprintf("gpu-3-mig-gi%d-ci%d", inst.GIID, inst.CIID)

	g := nodeDetail(t, f, "node-s").GPUs[3]
	if len(g.Devices) != 1 || g.Devices[0].Name != name || !g.Devices[0].Static || g.Devices[0].Profile != "3g.20gb" {
		t.Fatalf("gpu-3 devices %+v", g.Devices)
	}
	if !g.MIGEnabled || !g.MIGCapable || g.UUID != n.GPUs[3].UUID || g.Usage.State != kubectlgpu.StateFree {
		t.Errorf("gpu-3 %+v", g.GPUStatus)
	}
	want := []kubectlgpu.FreeMIG{{Profile: "3g.20gb", Placements: []int64{4}, Devices: []string{name}}}
	if diff := cmp.Diff(want, g.FreeMIG); diff != "" {
		t.Errorf("free (-want +got):\n%s", diff)
	}

	f.run("node-s", "default", at.Claim("static", onGPU(3, "mig")))
	g = nodeDetail(t, f, "node-s").GPUs[3]
	if len(g.FreeMIG) != 0 || len(g.Holders) != 1 || g.Holders[0].Device != name || g.Usage.MIG[0].Profile != "3g.20gb" {
		t.Errorf("allocated: free %v, holders %+v, usage %+v", g.FreeMIG, g.Holders, g.Usage)
	}
	out := mustRun(t, f.client(), nodes(), "")
	if !strings.Contains(out, "gpu-3 mig 3g.20gb") {
		t.Errorf("nodes:\n%s", out)
	}
}
