package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/hypernodes"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// TestVolcanoGangInOneClique: a Volcano gang Job with networkTopology {mode:
// hard, highestTierAllowed: 1} and no node affinity is placed as a whole
// inside one NVLink clique, through the tier-1 HyperNodes dra-controller
// keeps per clique (docs/compute-domains.md "Scheduling"): 2 pods x 4 GB200
// GPUs run on the two trays of rack-a, never one on rack-b's, round after
// round; 3 pods x 4 GPUs fit in no clique and none is bound, no claim
// allocated. The pods take no compute-domain channel here
// (TestVolcanoGangWithDomainTemplate does).
func TestVolcanoGangInOneClique(t *testing.T) {
	needVolcano(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	clique, rack, other := rackTrays(t, ctx)
	if len(rack) != 2 {
		t.Skipf("needs a clique of exactly two trays (a 2-pod gang fills it), clique %s has %v", clique, rack)
	}
	checkCliqueHyperNodes(t, ctx)
	ns := newNamespace(t, ctx, "e2e-clique-gang")
	claimTemplate(t, ctx, ns, "tray", resourceapi.ExactDeviceRequest{
		DeviceClassName: driverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 4,
		Selectors: celSelector(`device.attributes["gpu.dra.dev"].productName == "NVIDIA GB200"`),
	})

	for round := range 3 {
		name := fmt.Sprintf("train-%d", round)
		createCliqueJob(t, ctx, ns, name, 2, "")
		pods := waitJobRunning(t, ctx, ns, name, 2)
		var nodes []string
		for _, p := range pods {
			nodes = append(nodes, p.Spec.NodeName)
		}
		slices.Sort(nodes)
		if !slices.Equal(nodes, rack) {
			t.Fatalf("round %d: the gang runs on %v, want the two trays of clique %s %v (rack-b's tray is %s)", round, nodes, clique, rack, other)
		}
		t.Logf("round %d: %s on %v", round, name, nodes)
		deleteJob(t, ctx, ns, name)
	}

	// No clique has three free trays: the gang waits whole, nothing bound
	// or allocated.
	createCliqueJob(t, ctx, ns, "big", 3, "")
	if err := poll(ctx, func(ctx context.Context) (bool, error) { return len(jobPods(t, ctx, ns, "big")) == 3, nil }); err != nil {
		t.Fatalf("Volcano created %d of 3 pods of big", len(jobPods(t, ctx, ns, "big")))
	}
	assertJobHoldsNothing(t, ctx, ns, "big", 30*time.Second)
	t.Logf("3 x 4 GPUs: all pods Pending, no claim allocated (%s)", jobEvents(ctx, ns, jobPods(t, ctx, ns, "big")))
	deleteJob(t, ctx, ns, "big")
}

// TestVolcanoGangWithDomainTemplate: a Volcano gang Job whose pods take their
// GPUs and the channel of a ComputeDomain in template mode
// (resourceClaimTemplateName: each pod its own channel claim) runs whole in
// one clique: 2 pods x 4 GB200 GPUs on the two trays of rack-a, each pod's
// claim the domain's channel (status.channel) of that clique's pool, both
// containers with that channel's device node, one ComputeDomain Ready with
// both trays Connected. With the domain's shared claim instead, vc-scheduler
// never places the gang (docs/compute-domains.md "With Volcano").
func TestVolcanoGangWithDomainTemplate(t *testing.T) {
	needVolcano(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	clique, rack, other := rackTrays(t, ctx)
	if len(rack) != 2 {
		t.Skipf("needs a clique of exactly two trays (a 2-pod gang fills it), clique %s has %v", clique, rack)
	}
	checkCliqueHyperNodes(t, ctx)
	ns := newNamespace(t, ctx, "e2e-domain-gang")
	claimTemplate(t, ctx, ns, "tray", resourceapi.ExactDeviceRequest{
		DeviceClassName: driverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 4,
		Selectors: celSelector(`device.attributes["gpu.dra.dev"].productName == "NVIDIA GB200"`),
	})
	createTemplateDomain(t, ctx, ns, "train")

	createCliqueJob(t, ctx, ns, "train", 2, "train-channel")
	pods := waitJobRunning(t, ctx, ns, "train", 2)
	var nodes []string
	for _, p := range pods {
		nodes = append(nodes, p.Spec.NodeName)
	}
	slices.Sort(nodes)
	if !slices.Equal(nodes, rack) {
		t.Fatalf("the gang runs on %v, want the two trays of clique %s %v (rack-b's tray is %s)", nodes, clique, rack, other)
	}
	cd := waitDomainReady(t, ctx, ns, "train", rack...)
	if cd.Status.Channel == nil {
		t.Fatalf("ComputeDomain %s/train is Ready without a channel (status.channel)", ns)
	}
	want := vocabulary.ChannelDeviceName(int(*cd.Status.Channel))
	claims := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		claim := podClaimNamed(t, ctx, p, "channel")
		claims[claim.Name] = true
		r := claim.Status.Allocation.Devices.Results
		if len(r) != 1 || r[0].Pool != vocabulary.ChannelPoolName(clique) || r[0].Device != want {
			t.Errorf("pod %s: channel claim %s allocated %+v, want %s of pool %s", p.Name, claim.Name, r, want, vocabulary.ChannelPoolName(clique))
		}
		if got := podChannels(t, ctx, p); !slices.Equal(got, []string{fmt.Sprintf("channel%d", *cd.Status.Channel)}) {
			t.Errorf("pod %s sees IMEX channels %v, want channel%d", p.Name, got, *cd.Status.Channel)
		}
	}
	if len(claims) != 2 {
		t.Errorf("the pods' channel claims %v, want one each", claims)
	}
	t.Logf("2 pods on %v, channel %d, ComputeDomain Ready", nodes, *cd.Status.Channel)
	deleteJob(t, ctx, ns, "train")
}

// podClaimNamed returns the allocated claim of the pod's resource claim name
// (its own, generated from a template).
func podClaimNamed(t *testing.T, ctx context.Context, pod *corev1.Pod, name string) *resourceapi.ResourceClaim {
	t.Helper()
	p, err := env.cluster.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.Name != name || st.ResourceClaimName == nil {
			continue
		}
		claim, err := env.cluster.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if claim.Status.Allocation == nil {
			t.Fatalf("pod %s: claim %s is not allocated", pod.Name, claim.Name)
		}
		return claim
	}
	t.Fatalf("pod %s has no claim %q in its status %+v", pod.Name, name, p.Status.ResourceClaimStatuses)
	return nil
}

// checkCliqueHyperNodes waits until dra-controller keeps one managed tier-1
// HyperNode per clique of the cluster's nodes, its members those nodes.
func checkCliqueHyperNodes(t *testing.T, ctx context.Context) {
	t.Helper()
	nodes, err := env.cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: vocabulary.LabelClique})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	for _, n := range nodes.Items {
		c := n.Labels[vocabulary.LabelClique]
		want[hypernodes.Name(c)] = append(want[hypernodes.Name(c)], n.Name)
	}
	got := map[string][]string{}
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		list, err := env.cluster.Dynamic.Resource(hypernodes.Resource).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/managed-by=gpu-dra-controller"})
		if err != nil {
			return false, nil
		}
		clear(got)
		for _, hn := range list.Items {
			if tier, _, _ := unstructured.NestedInt64(hn.Object, "spec", "tier"); tier != hypernodes.Tier {
				return false, nil
			}
			members, _, _ := unstructured.NestedSlice(hn.Object, "spec", "members")
			for _, m := range members {
				name, _, _ := unstructured.NestedString(m.(map[string]any), "selector", "exactMatch", "name")
				got[hn.GetName()] = append(got[hn.GetName()], name)
			}
		}
		if len(got) != len(want) {
			return false, nil
		}
		for name, nodes := range want {
			slices.Sort(nodes)
			if !slices.Equal(got[name], nodes) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("HyperNodes of dra-controller %v, want one per clique, of tier %d, with its nodes %v", got, hypernodes.Tier, want)
	}
}

// createCliqueJob creates a Volcano Job: n pods of 4 GPUs each ("tray"
// template), all or none (minAvailable n) inside one tier-1 HyperNode,
// without node affinity; with channelTemplate, each pod also gets its own
// channel claim from that compute domain's template.
func createCliqueJob(t *testing.T, ctx context.Context, ns, name string, n int, channelTemplate string) {
	t.Helper()
	pod := workerPod(ns, "", "tray", name, nil)
	if channelTemplate == "" {
		pod.Spec.ResourceClaims = pod.Spec.ResourceClaims[:1] // no channel
		pod.Spec.Containers[0].Resources.Claims = pod.Spec.Containers[0].Resources.Claims[:1]
	} else {
		pod.Spec.ResourceClaims[1] = corev1.PodResourceClaim{Name: "channel", ResourceClaimTemplateName: &channelTemplate}
	}
	// Not best-effort: Volcano's backfill would bind such pods one by one
	// (the controller's gang guard adds the same).
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: apiresource.MustParse("10m")}
	tmpl, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels}, Spec: pod.Spec,
	})
	if err != nil {
		t.Fatal(err)
	}
	job := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": volcanoJobs.GroupVersion().String(),
		"kind":       "Job",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"schedulerName":   "volcano",
			"minAvailable":    int64(n),
			"networkTopology": map[string]any{"mode": "hard", "highestTierAllowed": int64(hypernodes.Tier)},
			"tasks": []any{map[string]any{
				"name": "worker", "replicas": int64(n), "template": tmpl,
			}},
		},
	}}
	if _, err := env.cluster.Dynamic.Resource(volcanoJobs).Namespace(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create Volcano Job %s/%s: %v", ns, name, err)
	}
}

// deleteJob deletes the Job and waits until its pods are gone, so that the
// trays are free for the next.
func deleteJob(t *testing.T, ctx context.Context, ns, name string) {
	t.Helper()
	if err := env.cluster.Dynamic.Resource(volcanoJobs).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete Volcano Job %s/%s: %v", ns, name, err)
	}
	if err := poll(ctx, func(ctx context.Context) (bool, error) { return len(jobPods(t, ctx, ns, name)) == 0, nil }); err != nil {
		t.Fatalf("pods of Volcano Job %s/%s still there: %s", ns, name, podPhases(jobPods(t, ctx, ns, name)))
	}
}
