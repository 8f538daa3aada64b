package devicemodel_test

import (
	"fmt"
	"sort"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// rackCluster simulates one node per entry, node name to machine (with its
// rack, gb200nvl72@rack-a).
func rackCluster(t *testing.T, machines map[string]string) (*at.Cluster, map[string]*simnode.Node) {
	t.Helper()
	nodes := map[string]*simnode.Node{}
	var all []*resourceapi.ResourceSlice
	for name, m := range machines {
		n := simnode.New(t, m, name)
		nodes[name] = n
		for i, s := range n.Slices(driverName) {
			s.Name = fmt.Sprintf("%s%s-%d", s.GenerateName, name, i)
			all = append(all, s)
		}
	}
	return at.NewCluster(all, deviceclass.DeviceClasses(driverName)), nodes
}

// The trays of one rack publish one clique on every GPU; a claim pinned to
// that clique (what a compute domain's workers ask once the first landed)
// fits on that rack's trays only, never on another rack's or on a node
// without a fabric, and matchAttribute on cliqueID keeps a claim's GPUs in
// one clique.
func TestAllocateInOneClique(t *testing.T) {
	machines := map[string]string{
		"tray-1": "gb200nvl72@rack-a",
		"tray-2": "gb200nvl72@rack-a",
		"tray-3": "gb200nvl72@rack-b",
		"pcie":   "l4x4",
	}
	_, nodes := rackCluster(t, machines)
	cliqueOf := func(node string) string {
		g := nodes[node].GPUs[0]
		for _, other := range nodes[node].GPUs {
			if other.CliqueID != g.CliqueID || other.ClusterUUID != g.ClusterUUID {
				t.Fatalf("%s: GPUs in cliques %q and %q", node, g.CliqueID, other.CliqueID)
			}
		}
		return g.CliqueID
	}
	rackA := cliqueOf("tray-1")
	if rackA == "" || cliqueOf("tray-2") != rackA || cliqueOf("tray-3") == rackA || cliqueOf("pcie") != "" {
		t.Fatalf("cliques: tray-1 %q tray-2 %q tray-3 %q pcie %q", rackA, cliqueOf("tray-2"), cliqueOf("tray-3"), cliqueOf("pcie"))
	}

	pinned := func() *resourceapi.ResourceClaim {
		return at.WithConstraints(
			at.Claim("worker", at.Exactly("gpus", driverName, 4,
				fmt.Sprintf(`device.attributes["gpu.dra.dev"].?cliqueID.orValue("") == %q`, rackA))),
			at.MatchAttribute(attr(vocabulary.AttrCliqueID)))
	}
	var fits []string
	for node := range machines {
		c, _ := rackCluster(t, map[string]string{node: machines[node]})
		got, err := c.Allocate(t.Context(), node, pinned())
		if err != nil {
			t.Fatalf("%s: %v", node, err)
		}
		if got != nil { // nil: does not fit
			fits = append(fits, node)
		}
	}
	sort.Strings(fits)
	if fmt.Sprint(fits) != "[tray-1 tray-2]" {
		t.Errorf("a worker pinned to rack-a's clique fits on %v, want [tray-1 tray-2]", fits)
	}

	// A claim that matches on cliqueID needs GPUs that have one.
	c, _ := rackCluster(t, map[string]string{"pcie": "l4x4"})
	c.MustNotFit(t, "pcie", at.WithConstraints(
		at.Claim("any", at.Exactly("gpus", driverName, 2)),
		at.MatchAttribute(attr(vocabulary.AttrCliqueID))))
}
