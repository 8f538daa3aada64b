package imexchannels

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

func node(name, clique string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if clique != "" {
		n.Labels = map[string]string{vocabulary.LabelClique: clique}
	}
	return n
}

func TestCliques(t *testing.T) {
	const a, b = "5e1f0000-0000-0000-0000-00000000000a.1", "5e1f0000-0000-0000-0000-00000000000b.1"
	cliques, invalid := Cliques([]*corev1.Node{
		node("tray-2", a), node("tray-3", b), node("tray-1", a), node("pcie", ""), node("odd", "Not_A.Pool"),
	})
	if diff := cmp.Diff([]string{a, b}, cliques); diff != "" {
		t.Errorf("cliques (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"Not_A.Pool"}, invalid); diff != "" {
		t.Errorf("invalid (-want +got):\n%s", diff)
	}
}

func TestResources(t *testing.T) {
	const clique = "5e1f0000-0000-0000-0000-00000000000a.1"
	pools := Resources([]string{clique}, 3).Pools
	pool, ok := pools[vocabulary.ChannelPoolName(clique)]
	if !ok || len(pools) != 1 {
		t.Fatalf("pools %v, want only %s", pools, vocabulary.ChannelPoolName(clique))
	}
	sel := pool.NodeSelector.NodeSelectorTerms[0].MatchExpressions
	if len(sel) != 1 || sel[0].Key != vocabulary.LabelClique || sel[0].Operator != corev1.NodeSelectorOpIn || strings.Join(sel[0].Values, ",") != clique {
		t.Errorf("node selector %+v, want %s In [%s]", sel, vocabulary.LabelClique, clique)
	}
	devs := pool.Slices[0].Devices
	if len(devs) != 3 {
		t.Fatalf("%d devices, want 3", len(devs))
	}
	for n, d := range devs {
		if d.Name != vocabulary.ChannelDeviceName(n) {
			t.Errorf("device %d named %s", n, d.Name)
		}
		got := map[string]string{}
		for k, v := range d.Attributes {
			switch {
			case v.StringValue != nil:
				got[string(k)] = *v.StringValue
			case v.IntValue != nil:
				got[string(k)] = strings.Repeat("I", int(*v.IntValue)) // int, not string
			}
		}
		want := map[string]string{
			"type": "imex-channel", "channel": strings.Repeat("I", n),
			"cliqueID": clique, "clusterUUID": "5e1f0000-0000-0000-0000-00000000000a",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s attributes (-want +got):\n%s", d.Name, diff)
		}
	}
}

func TestValidateChannels(t *testing.T) {
	for n, ok := range map[int]bool{0: false, 1: true, 32: true, 128: true, 129: false, -1: false} {
		err := ValidateChannels("--imex-channels", n)
		if (err == nil) != ok {
			t.Errorf("%d: error %v, want ok=%v", n, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--imex-channels") {
			t.Errorf("%d: error %q does not name the flag", n, err)
		}
	}
}
