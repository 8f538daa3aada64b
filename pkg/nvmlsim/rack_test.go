package nvmlsim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// fabricOf returns GPU index's fabric info on a started machine named name with seed.
func fabricOf(t *testing.T, name, seed string, index int) nvml.GpuFabricInfo {
	t.Helper()
	m, err := New(name, WithSeed(seed))
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	t.Cleanup(func() { m.Shutdown() })
	info := get(device(t, m, index).GetGpuFabricInfo()).must(t, "GetGpuFabricInfo")
	if info.State != nvml.GPU_FABRIC_STATE_COMPLETED || info.Status != uint32(nvml.SUCCESS) {
		t.Fatalf("%s: fabric %+v not completed", name, info)
	}
	return info
}

// Trays named with one rack share cluster UUID and clique; another rack, a tray
// without a rack and another clique of the same rack differ.
func TestRackFabric(t *testing.T) {
	a1 := fabricOf(t, "gb200nvl72@rack-a", "node-1", 0)
	a2 := fabricOf(t, "gb200nvl72@rack-a", "node-2", 3)
	b := fabricOf(t, "gb200nvl72@rack-b", "node-3", 0)
	alone := fabricOf(t, "gb200nvl72", "node-4", 0)
	a2nd := fabricOf(t, "gb200nvl72@rack-a/2", "node-5", 0)
	if a1.ClusterUuid != a2.ClusterUuid || a1.CliqueId != 1 || a2.CliqueId != 1 {
		t.Errorf("one rack: %+v and %+v, want one cluster UUID and clique 1", a1, a2)
	}
	if b.ClusterUuid == a1.ClusterUuid || alone.ClusterUuid == a1.ClusterUuid || alone.ClusterUuid == b.ClusterUuid {
		t.Errorf("different racks share a cluster UUID: %x %x %x", a1.ClusterUuid, b.ClusterUuid, alone.ClusterUuid)
	}
	if a2nd.ClusterUuid != a1.ClusterUuid || a2nd.CliqueId != 2 {
		t.Errorf("rack-a/2: %+v, want rack-a's cluster UUID and clique 2", a2nd)
	}
}

func TestCheckMachine(t *testing.T) {
	for name, want := range map[string]string{
		"gb200nvl72":           "",
		"gb200nvl72@r1":        "",
		"gb200nvl72@r1/7":      "",
		"dgxh100@r1":           "",
		"l4x4@r1":              "has no NVLink fabric",
		"dgxa100@r1":           "has no NVLink fabric",
		"gb200nvl72@":          `rack ""`,
		"gb200nvl72@r1/0":      `clique "0"`,
		"gb200nvl72@r1/x":      `clique "x"`,
		"gb200nvl72@r 1":       `rack "r 1"`,
		"gb300@r1":             `unknown simulated machine "gb300"`,
		"gb200nvl72@r1/2/3":    `clique "2/3"`,
		"gb200nvl72@r1,n2=foo": `rack "r1,n2=foo"`,
	} {
		err := CheckMachine(name)
		switch {
		case want == "" && err != nil:
			t.Errorf("CheckMachine(%q): %v", name, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("CheckMachine(%q) = %v, want an error with %q", name, err, want)
		}
		if _, newErr := New(name); (newErr == nil) != (err == nil) {
			t.Errorf("New(%q) = %v, CheckMachine %v", name, newErr, err)
		}
	}
}

// A tray's driver root has its IMEX channel device nodes; a DGX has none.
func TestIMEXChannelNodes(t *testing.T) {
	for machine, want := range map[string]int{"gb200nvl72@rack-a": 64, "dgxh100": 0} {
		m, err := New(machine)
		if err != nil {
			t.Fatal(err)
		}
		root := t.TempDir()
		if err := m.WriteDriverRoot(root); err != nil {
			t.Fatal(err)
		}
		got, _ := filepath.Glob(filepath.Join(root, "dev", "nvidia-caps-imex-channels", "channel*"))
		if len(got) != want || m.IMEXChannels() != want {
			t.Errorf("%s: %d channel nodes, IMEXChannels %d, want %d", machine, len(got), m.IMEXChannels(), want)
		}
		if want > 0 {
			if _, err := os.Stat(filepath.Join(root, "dev", IMEXChannelNode(want-1))); err != nil {
				t.Errorf("%s: %v", machine, err)
			}
		}
	}
}
