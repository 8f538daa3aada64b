package hwcheck

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

func TestMain(m *testing.M) { os.Exit(simnode.Main(m)) }

// Two simulated machines of the same model (different seeds: other UUIDs)
// have the same shape GPU by GPU, and their counters add up.
func TestCompareSameModelHasNoDifferences(t *testing.T) {
	for _, machine := range nvmlsim.Machines() {
		t.Run(machine, func(t *testing.T) {
			a := simnode.New(t, machine, "node-a")
			b := simnode.New(t, machine, "node-b")
			if a.GPUs[0].UUID == b.GPUs[0].UUID {
				t.Fatal("both nodes have the same UUIDs; the comparison would not show it ignores them")
			}
			for i := range a.GPUs {
				// Different GPUs of one machine differ only in what
				// identifies them, so compare GPU i with GPU 0 too.
				for _, other := range []discovery.GPU{b.GPUs[i], b.GPUs[0]} {
					if diffs := Compare(ShapeOf(a.GPUs[i], devicemodel.Options{}), ShapeOf(other, devicemodel.Options{})); len(diffs) > 0 {
						t.Errorf("%s vs %s: %v", a.GPUs[i].CanonicalName(), other.CanonicalName(), diffs)
					}
				}
				if problems := CheckCounters(ShapeOf(a.GPUs[i], devicemodel.Options{})); len(problems) > 0 {
					t.Errorf("counters: %v", problems)
				}
			}
		})
	}
}

// A deliberately altered GPU produces exactly the differences made.
func TestCompareFindsAlteredDevice(t *testing.T) {
	node := simnode.New(t, "dgxh200", "node-1")
	sim := node.GPUs[0]
	real := cloneGPU(node.GPUs[3])
	real.MemoryBytes += 1 << 20
	real.NUMANode = -1 // sysfs gave none
	small := &real.MIG.Profiles[0]
	small.Placements = small.Placements[1:]
	small.MaxInstances--
	real.MIG.Profiles = slices.DeleteFunc(real.MIG.Profiles, func(p mig.Profile) bool {
		return strings.HasSuffix(p.Name, "+me") && p.ComputeSlices == 1 && p.MemorySlices == 1
	})

	diffs := Compare(ShapeOf(real, devicemodel.Options{}), ShapeOf(sim, devicemodel.Options{}))
	got := map[string]Difference{}
	for _, d := range diffs {
		got[d.What] = d
	}
	want := []string{
		"model memoryBytes",
		"device gpu capacity memory",
		"device gpu attribute resource.kubernetes.io/numaNode",
		"device gpu-mig-" + strings.ReplaceAll(small.Name, ".", "") + "-0",
		"mig profile " + small.Name + " placements",
		"mig profile " + small.Name + " maxInstances",
		"mig profile order",
	}
	for _, w := range want {
		if _, ok := got[w]; !ok {
			t.Errorf("no difference %q among %d: %v", w, len(diffs), diffs)
		}
	}
	if d := got["device gpu attribute resource.kubernetes.io/numaNode"]; d.Simulated != "int" || d.Real != absent {
		t.Errorf("numaNode difference %+v: the altered side is the first argument", d)
	}
	if d := got["model memoryBytes"]; d.GPU != real.CanonicalName() {
		t.Errorf("difference names GPU %q, want the real one %q", d.GPU, real.CanonicalName())
	}
	for _, d := range diffs {
		for _, noise := range []string{"uuid", "pciBusID", "index", "minor"} {
			if strings.HasSuffix(d.What, "/"+noise) || strings.HasSuffix(d.What, " "+noise) {
				t.Errorf("difference in an identifying attribute: %v", d)
			}
		}
	}
	if ShapeOf(real, devicemodel.Options{}).Devices["gpu"].Attributes["uuid"] != "string" {
		t.Error("no uuid attribute: the noise check above checks nothing")
	}
}

func TestCheckCountersFindsWhatDoesNotAddUp(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	good := ShapeOf(node.GPUs[0], devicemodel.Options{})
	for name, alter := range map[string]func(s *Shape) string{
		"NVML admits fewer instances than the counters": func(s *Shape) string {
			s.MIG[0].MaxInstances--
			return "MIG profile " + s.MIG[0].Name
		},
		"a device consumes an unknown counter": func(s *Shape) string {
			d := s.Devices["gpu"]
			d.Consumes = map[string]string{"bogus": "1"}
			s.Devices["gpu"] = d
			return "counter bogus"
		},
		"the whole GPU fits beside a MIG device": func(s *Shape) string {
			d := s.Devices["gpu"]
			d.Consumes = map[string]string{"compute-slices": "6"}
			s.Devices["gpu"] = d
			return "gpu takes the whole GPU, but its counters fit beside device gpu-mig-1g10gb-"
		},
		"a share fits beside the whole GPU": func(s *Shape) string {
			d := s.Devices["gpu-ts"]
			d.Consumes = map[string]string{"memory-slice-0": "1"}
			s.Devices["gpu-ts"] = d
			return "gpu-ts takes the whole GPU, but its counters fit beside device gpu-mig-1g10gb-"
		},
		"a device consumes more than there is": func(s *Shape) string {
			for name, d := range s.Devices {
				if d.Profile != "" {
					d.Consumes["compute-slices"] = "8"
					s.Devices[name] = d
					return "more than the 7"
				}
			}
			return "no MIG device"
		},
	} {
		t.Run(name, func(t *testing.T) {
			if p := CheckCounters(good); len(p) > 0 {
				t.Fatalf("unaltered: %v", p)
			}
			s := cloneShape(good)
			want := alter(&s)
			problems := CheckCounters(s)
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
				t.Errorf("problems %v lack %q", problems, want)
			}
		})
	}
}

func cloneGPU(g discovery.GPU) discovery.GPU {
	if g.MIG != nil {
		info := *g.MIG
		info.Profiles = slices.Clone(info.Profiles)
		for i := range info.Profiles {
			info.Profiles[i].Placements = slices.Clone(info.Profiles[i].Placements)
		}
		g.MIG = &info
	}
	return g
}

func cloneShape(s Shape) Shape {
	out := s
	out.MIG = slices.Clone(s.MIG)
	out.Devices = map[string]DeviceShape{}
	for name, d := range s.Devices {
		c := d
		c.Consumes = map[string]string{}
		for k, v := range d.Consumes {
			c.Consumes[k] = v
		}
		out.Devices[name] = c
	}
	return out
}
