package imexchannels

import (
	"fmt"
	"os"
	"strings"
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

// allocationCluster is the scheduler's allocator over two trays of rack-a
// and one of rack-b, labelled as nodelabels labels them, with the channel
// slices this controller publishes (channels per clique).
func allocationCluster(t *testing.T, channels int) (cluster *at.Cluster, nodeLabels map[string]map[string]string, rackA, rackB string) {
	t.Helper()
	nodeLabels = map[string]map[string]string{}
	var objs []runtime.Object
	var gpuSlices []*resourceapi.ResourceSlice
	for name, machine := range trays {
		slices := simnode.New(t, machine, name).Slices(driver)
		gpuSlices = append(gpuSlices, slices...)
		nodeLabels[name] = nodelabels.Labels(driver, slices)
		objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: nodeLabels[name]}})
	}
	client := newClient(objs...)
	start(t, client, channels)
	rackA, rackB = nodeLabels["tray-1"][labelKey], nodeLabels["tray-3"][labelKey]
	channelSlices := PublishedPools(t, client, map[string]int{rackA: channels, rackB: channels})
	cluster = at.NewCluster(append(gpuSlices, channelSlices...), deviceclass.DeviceClasses(driver))
	cluster.NodeLabels = nodeLabels
	return cluster, nodeLabels, rackA, rackB
}

var trays = map[string]string{"tray-1": "gb200nvl72@rack-a", "tray-2": "gb200nvl72@rack-a", "tray-3": "gb200nvl72@rack-b"}

func channelDomain(name string, mutate func(*gpuv1beta1.ComputeDomain)) *gpuv1beta1.ComputeDomain {
	cd := &gpuv1beta1.ComputeDomain{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team", UID: types.UID("uid-" + name)}}
	mutate(cd)
	return cd
}

// TestSharedChannelClaimStaysInOneClique: a domain's shared channel claim,
// as the ComputeDomain reconciler creates it for the domain's channel
// number, gets that channel, and its allocation's node selector admits only
// the nodes of that channel's clique; a second domain gets its own number.
// Channel numbers are cluster-wide: with two channels per clique a third
// number fits nowhere.
func TestSharedChannelClaimStaysInOneClique(t *testing.T) {
	cluster, nodeLabels, rackA, _ := allocationCluster(t, 2)
	domainClaim := func(name string, k int32) *resourceapi.ResourceClaim {
		cd := channelDomain(name, func(cd *gpuv1beta1.ComputeDomain) { cd.Spec.Channel.ResourceClaimName = name + "-channel" })
		return computedomain.ChannelClaim(cd, driver, k)
	}
	// The first pod of the domain lands on tray-1.
	first := cluster.MustAllocate(t, "tray-1", domainClaim("a", 1))[0]
	alloc := first.Status.Allocation
	if len(alloc.Devices.Results) != 1 || alloc.Devices.Results[0].Pool != "imex-channels."+rackA || alloc.Devices.Results[0].Device != "channel-1" {
		t.Fatalf("allocated %+v, want channel-1 of rack-a's clique", alloc.Devices.Results)
	}
	selector, err := nodeaffinity.NewNodeSelector(alloc.NodeSelector)
	if err != nil || alloc.NodeSelector == nil {
		t.Fatalf("allocation node selector %v: %v", alloc.NodeSelector, err)
	}
	for name := range trays {
		admits := selector.Match(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: nodeLabels[name]}})
		if want := name != "tray-3"; admits != want {
			t.Errorf("the allocation admits %s: %v, want %v", name, admits, want)
		}
	}
	second := cluster.MustAllocate(t, "tray-2", domainClaim("b", 0))[0]
	if got := fmt.Sprint(at.Devices(second)); got == fmt.Sprint(at.Devices(first)) || !strings.HasSuffix(got, "channel-0]") {
		t.Errorf("the second domain got %s, want its own channel-0", got)
	}
	for _, node := range []string{"tray-1", "tray-3"} {
		cluster.MustNotFit(t, node, domainClaim("c", 2))
	}
}

// TestTemplateClaimsShareChannel: the per-pod claims of a domain in
// template mode, made from the reconciler's template, all get the domain's
// channel of the clique their pod's node is in, although a device was
// allocated once before (allowMultipleAllocations); a second domain's
// claims get its own number, never the first's.
func TestTemplateClaimsShareChannel(t *testing.T) {
	cluster, _, rackA, rackB := allocationCluster(t, 4)
	podClaims := func(domain string, k int32, pods int) []*resourceapi.ResourceClaim {
		cd := channelDomain(domain, func(cd *gpuv1beta1.ComputeDomain) { cd.Spec.Channel.ResourceClaimTemplateName = domain + "-channel" })
		tmpl := computedomain.ChannelClaimTemplate(cd, driver, k)
		var out []*resourceapi.ResourceClaim
		for i := range pods {
			out = append(out, &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-worker-%d-channel", domain, i), Namespace: cd.Namespace, UID: types.UID(fmt.Sprintf("%s-%d", domain, i))},
				Spec:       *tmpl.Spec.Spec.DeepCopy(),
			})
		}
		return out
	}
	// Four workers of "train" (channel 2), two on each rack-a tray.
	for i, claim := range podClaims("train", 2, 4) {
		got := cluster.MustAllocate(t, []string{"tray-1", "tray-2"}[i%2], claim)[0]
		if r := got.Status.Allocation.Devices.Results; len(r) != 1 || r[0].Pool != "imex-channels."+rackA || r[0].Device != "channel-2" {
			t.Errorf("worker %d got %+v, want channel-2 of rack-a's pool", i, r)
		}
	}
	// "eval" (channel 0) on the same trays gets channel 0.
	for i, claim := range podClaims("eval", 0, 2) {
		got := cluster.MustAllocate(t, "tray-1", claim)[0]
		if d := got.Status.Allocation.Devices.Results[0].Device; d != "channel-0" {
			t.Errorf("eval worker %d got %s, want channel-0", i, d)
		}
	}
	// A template-mode claim follows its node's clique: the pool does not
	// keep a domain in one clique, the scheduler must (Volcano's
	// networkTopology, docs/compute-domains.md).
	got := cluster.MustAllocate(t, "tray-3", podClaims("train", 2, 5)[4])[0]
	if r := got.Status.Allocation.Devices.Results[0]; r.Pool != "imex-channels."+rackB || r.Device != "channel-2" {
		t.Errorf("a worker on rack-b got %s/%s, want channel-2 of rack-b's pool", r.Pool, r.Device)
	}
}
