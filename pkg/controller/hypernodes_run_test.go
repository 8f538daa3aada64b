package controller

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/hypernodes"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// TestRunKeepsHyperNodes: with the flag defaults the leader keeps a
// HyperNode for the clique of a labelled node where the HyperNode API is
// served; with --volcano-hypernodes=false (and another leader controller
// running) it keeps none.
func TestRunKeepsHyperNodes(t *testing.T) {
	const clique = "6f1c2b7e-0d4a-4c55-9a35-1b2e3c4d5e6f.1"
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"default on", nil, 1},
		{"off", []string{"--volcano-hypernodes=false", "--node-labels"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "tray-1", Labels: map[string]string{vocabulary.LabelClique: clique}}})
			client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
				GroupVersion: hypernodes.Resource.GroupVersion().String(),
				APIResources: []metav1.APIResource{{Name: hypernodes.Resource.Resource, Kind: hypernodes.Kind}},
			}}
			cfg := defaults(t, append([]string{"--namespace=gpu", "--webhook=false", "--leader-elect=false", "--node-labels=false", "--outage-taints=false"}, tc.args...)...)
			cfg.KubeClient = client
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			start(t, cfg)
			count := func() int {
				list, err := cfg.DynamicClient.Resource(hypernodes.Resource).List(context.Background(), metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return len(list.Items)
			}
			if tc.want > 0 {
				poll(t, "HyperNode of the clique", func() bool { return count() == tc.want })
			} else {
				time.Sleep(time.Second) // what "on" takes well under
			}
			if got := count(); got != tc.want {
				t.Errorf("%d HyperNodes, want %d", got, tc.want)
			}
		})
	}
}
