package imexchannels

import (
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/computedomain"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/nodelabels"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
)

func TestMain(m *testing.M) { os.Exit(simnode.Main(m)) }

// TestSharedChannelClaimStaysInOneClique runs the scheduler's allocator over
// two trays of rack-a and one of rack-b, labelled as nodelabels labels them,
// with the channel slices this controller publishes: a domain's shared
// channel claim, as the ComputeDomain reconciler creates it, gets one
// channel, and its allocation's node selector admits only the nodes of that
// channel's clique; a second domain gets another channel.
func TestSharedChannelClaimStaysInOneClique(t *testing.T) {
	machines := map[string]string{"tray-1": "gb200nvl72@rack-a", "tray-2": "gb200nvl72@rack-a", "tray-3": "gb200nvl72@rack-b"}
	nodeLabels := map[string]map[string]string{}
	var objs []runtime.Object
	var gpuSlices []*resourceapi.ResourceSlice
	for name, machine := range machines {
		slices := simnode.New(t, machine, name).Slices(driver)
		gpuSlices = append(gpuSlices, slices...)
		nodeLabels[name] = nodelabels.Labels(driver, slices)
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: nodeLabels[name]}})
	}
	client := newClient(objs...)
	start(t, client, 2)
	rackA, rackB := nodeLabels["tray-1"][labelKey], nodeLabels["tray-3"][labelKey]
	channelSlices := PublishedPools(t, client, map[string]int{rackA: 2, rackB: 2})

	cluster := at.NewCluster(append(gpuSlices, channelSlices...), deviceclass.DeviceClasses(driver))
	cluster.NodeLabels = nodeLabels
	domainClaim := func(name string) *resourceapi.ResourceClaim {
		cd := &gpuv1beta1.ComputeDomain{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team", UID: types.UID("uid-" + name)}}
		cd.Spec.Channel.ResourceClaimName = name + "-channel"
		return computedomain.ChannelClaim(cd, driver)
	}
	// The first pod of the domain lands on tray-1.
	first := cluster.MustAllocate(t, "tray-1", domainClaim("a"))[0]
	alloc := first.Status.Allocation
	if len(alloc.Devices.Results) != 1 || alloc.Devices.Results[0].Pool != "imex-channels."+rackA {
		t.Fatalf("allocated %+v, want one channel of rack-a's clique", alloc.Devices.Results)
	}
	selector, err := nodeaffinity.NewNodeSelector(alloc.NodeSelector)
	if err != nil || alloc.NodeSelector == nil {
		t.Fatalf("allocation node selector %v: %v", alloc.NodeSelector, err)
	}
	for name := range machines {
		admits := selector.Match(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: nodeLabels[name]}})
		if want := name != "tray-3"; admits != want {
			t.Errorf("the allocation admits %s: %v, want %v", name, admits, want)
		}
	}
	second := cluster.MustAllocate(t, "tray-2", domainClaim("b"))[0]
	if a, b := fmt.Sprint(at.Devices(first)), fmt.Sprint(at.Devices(second)); a == b {
		t.Errorf("two domains got the same channel %s", a)
	}
	// Rack-a has two channels: a third domain fits only on rack-b.
	cluster.MustNotFit(t, "tray-1", domainClaim("c"))
	cluster.MustAllocate(t, "tray-3", domainClaim("c"))
}
