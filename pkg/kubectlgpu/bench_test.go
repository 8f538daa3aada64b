package kubectlgpu_test

import (
	"fmt"
	"io"
	goruntime "runtime"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
)

// largeCluster is n copies of the standard cluster's dgxh100 node with its
// claims and pods, as the plugin would list them: 224 devices in 5 slices
// and 7 claims per node. The copies share their device lists; Build reads
// them and does not write.
func largeCluster(b *testing.B, n int) *kubectlgpu.Source {
	b.Helper()
	f := standardCluster(b)
	src := &kubectlgpu.Source{}
	var claims []*resourceapi.ResourceClaim
	var pods []*corev1.Pod
	for _, o := range f.objects {
		switch o := o.(type) {
		case *resourceapi.ResourceClaim:
			if o.Status.Allocation != nil && o.Status.Allocation.Devices.Results[0].Pool == "node-a" {
				claims = append(claims, o)
			}
		case *corev1.Pod:
			if o.Spec.NodeName == "node-a" {
				pods = append(pods, o)
			}
		}
	}
	for i := range n {
		node := fmt.Sprintf("node-%04d", i)
		for _, s := range f.slices {
			if *s.Spec.NodeName != "node-a" {
				continue
			}
			c := *s
			c.Name = fmt.Sprintf("%s-%s", node, s.Name)
			c.Spec.NodeName = &node
			c.Spec.Pool.Name = node
			src.Slices = append(src.Slices, c)
		}
		for _, claim := range claims {
			c := claim.DeepCopy()
			c.Name = fmt.Sprintf("%s-%s", node, claim.Name)
			c.UID = types.UID(c.Name)
			for j := range c.Status.Allocation.Devices.Results {
				c.Status.Allocation.Devices.Results[j].Pool = node
			}
			c.Status.ReservedFor[0].Name = c.Name
			c.Status.ReservedFor[0].UID = types.UID("pod-" + c.Name)
			src.Claims = append(src.Claims, *c)
		}
		for _, pod := range pods {
			p := pod.DeepCopy()
			p.Name = fmt.Sprintf("%s-%s", node, pod.Name)
			p.UID = types.UID("pod-" + p.Name)
			p.Spec.NodeName = node
			claim := p.Name
			p.Spec.ResourceClaims[0].ResourceClaimName = &claim
			src.Pods = append(src.Pods, *p)
		}
	}
	return src
}

// BenchmarkInventory1000Nodes is the work of `kubectl gpu nodes`, `claims
// -A` and `node NAME` after the lists arrive, on 1,000 DGX H100 nodes
// (224,000 devices in 5,000 slices, 7,000 claims and pods): building the
// indexes, then the report and its table.
func BenchmarkInventory1000Nodes(b *testing.B) {
	src := largeCluster(b, 1000)
	b.Run("build", func(b *testing.B) {
		for range b.N {
			kubectlgpu.Build(driverName, src)
		}
	})
	b.Run("nodes", func(b *testing.B) {
		for range b.N {
			inv := kubectlgpu.Build(driverName, src)
			if err := kubectlgpu.PrintNodes(io.Discard, inv.NodeList(), false); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("claims", func(b *testing.B) {
		for range b.N {
			inv := kubectlgpu.Build(driverName, src)
			if err := kubectlgpu.PrintClaims(io.Discard, inv.ClaimList(""), false); err != nil {
				b.Fatal(err)
			}
		}
	})
	// `kubectl gpu node` lists one node's slices and pods, and every claim.
	one := &kubectlgpu.Source{Claims: src.Claims}
	for _, s := range src.Slices {
		if *s.Spec.NodeName == "node-0500" {
			one.Slices = append(one.Slices, s)
		}
	}
	for _, p := range src.Pods {
		if p.Spec.NodeName == "node-0500" {
			one.Pods = append(one.Pods, p)
		}
	}
	b.Run("node", func(b *testing.B) {
		for range b.N {
			inv := kubectlgpu.Build(driverName, one)
			d, err := inv.NodeDetail("node-0500")
			if err != nil {
				b.Fatal(err)
			}
			if err := kubectlgpu.PrintNode(io.Discard, d, false); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkLoad1000Nodes lists 1,000 DGX H100 nodes' slices from a client
// that hands out fresh objects page by page, as a decoded response would,
// and builds the inventory as the pages come. retained-MB is the heap the
// inventory keeps (the objects themselves take about 1.4 MB per node).
func BenchmarkLoad1000Nodes(b *testing.B) {
	src := largeCluster(b, 1000)
	client := fake.NewClientset()
	client.PrependReactor("list", "resourceclaims", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, &resourceapi.ResourceClaimList{Items: src.Claims}, nil
	})
	client.PrependReactor("list", "resourceslices", func(a clienttesting.Action) (bool, runtime.Object, error) {
		opts := a.(clienttesting.ListActionImpl).ListOptions
		start, _ := strconv.Atoi(opts.Continue)
		end := min(start+int(opts.Limit), len(src.Slices))
		list := &resourceapi.ResourceSliceList{}
		for i := start; i < end; i++ {
			list.Items = append(list.Items, *src.Slices[i].DeepCopy())
		}
		if end < len(src.Slices) {
			list.Continue = strconv.Itoa(end)
		}
		return true, list, nil
	})
	var retained float64
	for range b.N {
		var before, after goruntime.MemStats
		goruntime.GC()
		goruntime.ReadMemStats(&before)
		inv, _, err := kubectlgpu.Load(b.Context(), client, kubectlgpu.Scope{Driver: driverName})
		if err != nil {
			b.Fatal(err)
		}
		goruntime.GC()
		goruntime.ReadMemStats(&after)
		retained = float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
		if got := len(inv.Nodes); got != 1000 {
			b.Fatalf("%d nodes", got)
		}
	}
	b.ReportMetric(retained, "retained-MB")
}
