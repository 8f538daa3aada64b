package node

import (
	"context"
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// rackNodes is a simulated fleet from one --simulate-node-machines flag:
// two trays of rack-a, one of rack-b.
const rackNodes = "tray-1=gb200nvl72@rack-a,tray-2=gb200nvl72@rack-a,tray-3=gb200nvl72@rack-b"

// startTray starts the plugin of node as the fleet's DaemonSet would (one
// --simulate and --simulate-node-machines for all nodes) and returns it with
// its published slices.
func startTray(t *testing.T, node string, claims ...*resourceapi.ResourceClaim) (*inprocess.Plugin, []*resourceapi.ResourceSlice) {
	t.Helper()
	dirs, err := pluginrun.NewDirs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := dirs.Config("gb200nvl72", node)
	cfg.SimulateNodeMachines = rackNodes
	if err := cfg.Validate(); err != nil { // resolves this node's machine, as main does
		t.Fatal(err)
	}
	client := apiserver.NodeClient(node, claims...)
	cfg.KubeClient = client
	ctx := context.Background()
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start plugin on %s: %v", node, err)
	}
	t.Cleanup(func() { _ = p.Stop() })
	var slices []*resourceapi.ResourceSlice
	eventually(t, 30*time.Second, node+" slices published", func() bool {
		l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) == 0 {
			return false
		}
		// Every slice of the pool's generation, not the first ones written.
		for _, s := range l.Items {
			if s.Spec.Pool.ResourceSliceCount != int64(len(l.Items)) {
				return false
			}
		}
		slices = nil
		for i := range l.Items {
			slices = append(slices, &l.Items[i])
		}
		return true
	})
	return p, slices
}

// clique returns the one cliqueID the node's GPUs publish.
func clique(t *testing.T, node string, slices []*resourceapi.ResourceSlice) string {
	t.Helper()
	found := map[string]bool{}
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			if v := d.Attributes[vocabulary.AttrCliqueID].StringValue; v != nil {
				found[*v] = true
			} else if d.Attributes[vocabulary.AttrType].StringValue != nil && *d.Attributes[vocabulary.AttrType].StringValue == string(vocabulary.KindGPU) {
				t.Errorf("%s: GPU %s has no %s", node, d.Name, vocabulary.AttrCliqueID)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: cliques %v, want one", node, found)
	}
	for c := range found {
		return c
	}
	return ""
}

// The plugins of a simulated rack publish the rack's clique on every GPU,
// another rack's tray another clique; a claim pinned to rack-a's clique,
// allocated by the upstream allocator from tray-1's slices, is prepared there
// through the kubelet stand-in.
func TestRackClique(t *testing.T) {
	_, s1 := startTray(t, "tray-1")
	_, s2 := startTray(t, "tray-2")
	_, s3 := startTray(t, "tray-3")
	a, a2, b := clique(t, "tray-1", s1), clique(t, "tray-2", s2), clique(t, "tray-3", s3)
	if a != a2 || a == b {
		t.Fatalf("cliques tray-1 %q tray-2 %q tray-3 %q: want rack-a's shared and rack-b's different", a, a2, b)
	}

	pin := fmt.Sprintf(`device.attributes["gpu.dra.dev"].?cliqueID.orValue("") == %q`, a)
	worker := func() *resourceapi.ResourceClaim {
		return at.WithConstraints(at.Claim("worker", at.Exactly("gpus", driverName, 4, pin)),
			at.MatchAttribute(resourceapi.FullyQualifiedName(driverName+"/"+vocabulary.AttrCliqueID)))
	}
	at.NewCluster(s3, deviceclass.DeviceClasses(driverName)).MustNotFit(t, "tray-3", worker())
	claim := at.NewCluster(s1, deviceclass.DeviceClasses(driverName)).MustAllocate(t, "tray-1", worker())[0]
	p, _ := startTray(t, "tray-1", claim)
	ids, err := p.Kubelet.PrepareOne(context.Background(), claim)
	if err != nil || len(ids) != 4 {
		t.Fatalf("prepare the pinned worker on tray-1: %v, %d CDI devices", err, len(ids))
	}
	if err := p.Kubelet.UnprepareOne(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
}
