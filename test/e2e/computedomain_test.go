package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// The compute-domain tests run on the GB200 trays of the local cluster
// (hack/demo/lib.sh: two trays of rack-a, one of rack-b, tainted
// env.trayTaint): a domain's pods land in one NVLink clique, each of their
// nodes runs the domain's IMEX daemon connected to the others, and the tray
// of the other rack never joins (docs/compute-domains.md).

// rackTrays waits until dra-controller has labelled the trays with their
// clique and returns the clique with two or more trays, its trays, and a tray
// of another clique. It skips, saying why, on a cluster without them.
func rackTrays(t *testing.T, ctx context.Context) (clique string, rack []string, other string) {
	t.Helper()
	if len(env.trays) < 3 {
		t.Skipf("needs 3 GB200 trays tainted %s (two of one rack, one of another; make e2e starts them, GDD_NODES=6), the cluster has %v", env.trayTaint, env.trays)
	}
	byClique := map[string][]string{}
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		clear(byClique)
		for _, n := range env.trays {
			node, err := env.cluster.Client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			c := node.Labels[vocabulary.LabelClique]
			if c == "" {
				return false, nil
			}
			byClique[c] = append(byClique[c], n)
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("trays %v not all labelled %s by dra-controller: %v", env.trays, vocabulary.LabelClique, err)
	}
	for c, nodes := range byClique {
		if len(nodes) >= 2 {
			clique, rack = c, nodes
		} else {
			other = nodes[0]
		}
	}
	if clique == "" || other == "" {
		t.Fatalf("trays by clique %v: want one clique of two or more trays and a tray of another", byClique)
	}
	slices.Sort(rack)
	return clique, rack, other
}

// createDomain creates a ComputeDomain and waits for the controller's channel claim.
func createDomain(t *testing.T, ctx context.Context, ns, name string, lifetime *gpuv1beta1.ComputeDomainLifetime) {
	t.Helper()
	createDomainObject(t, ctx, ns, name, gpuv1beta1.ComputeDomainChannel{ResourceClaimName: name + "-channel"}, lifetime)
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := env.cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, name+"-channel", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("dra-controller created no claim %s-channel for ComputeDomain %s/%s: %v", name, ns, name, err)
	}
}

// createTemplateDomain creates a ComputeDomain in template mode (a channel
// claim per pod) and waits for the controller's claim template.
func createTemplateDomain(t *testing.T, ctx context.Context, ns, name string) {
	t.Helper()
	createDomainObject(t, ctx, ns, name, gpuv1beta1.ComputeDomainChannel{ResourceClaimTemplateName: name + "-channel"}, nil)
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := env.cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, name+"-channel", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		cd, _ := getDomain(ctx, ns, name)
		t.Fatalf("dra-controller created no claim template %s-channel for ComputeDomain %s/%s: %v (status %+v)", name, ns, name, err, cd)
	}
}

func createDomainObject(t *testing.T, ctx context.Context, ns, name string, channel gpuv1beta1.ComputeDomainChannel, lifetime *gpuv1beta1.ComputeDomainLifetime) {
	t.Helper()
	cd := &gpuv1beta1.ComputeDomain{
		TypeMeta:   metav1.TypeMeta{APIVersion: gpuv1beta1.GroupVersion.String(), Kind: gpuv1beta1.ComputeDomainKind},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       gpuv1beta1.ComputeDomainSpec{Channel: channel, Lifetime: lifetime},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := domains(ns).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ComputeDomain %s/%s: %v", ns, name, err)
	}
}

func domains(ns string) interface {
	Create(context.Context, *unstructured.Unstructured, metav1.CreateOptions, ...string) (*unstructured.Unstructured, error)
	Get(context.Context, string, metav1.GetOptions, ...string) (*unstructured.Unstructured, error)
} {
	return env.cluster.Dynamic.Resource(gpuv1beta1.ComputeDomainResource).Namespace(ns)
}

func getDomain(ctx context.Context, ns, name string) (*gpuv1beta1.ComputeDomain, error) {
	u, err := domains(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var cd gpuv1beta1.ComputeDomain
	return &cd, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cd)
}

// waitDomainReady waits until the domain is Ready on exactly the nodes given,
// each daemon Connected, and returns it.
func waitDomainReady(t *testing.T, ctx context.Context, ns, name string, nodes ...string) *gpuv1beta1.ComputeDomain {
	t.Helper()
	var cd *gpuv1beta1.ComputeDomain
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		if cd, err = getDomain(ctx, ns, name); err != nil {
			return false, nil
		}
		var got []string
		for _, n := range cd.Status.Nodes {
			if n.Daemon.State != gpuv1beta1.DaemonConnected {
				return false, nil
			}
			got = append(got, n.Name)
		}
		slices.Sort(got)
		return slices.Equal(got, nodes) && condStatus(cd.Status.Conditions, "Ready") == metav1.ConditionTrue, nil
	})
	if err != nil {
		t.Fatalf("ComputeDomain %s/%s not Ready on %v: status %+v", ns, name, nodes, cd)
	}
	return cd
}

func condStatus(conds []metav1.Condition, typ string) metav1.ConditionStatus {
	for _, c := range conds {
		if c.Type == typ {
			return c.Status
		}
	}
	return metav1.ConditionUnknown
}

// workerPod is a pod of a domain on a tray: gpus GPUs from a template, the
// domain's channel claim, the trays' toleration, and optional node affinity.
func workerPod(ns, name, gpuTemplate, domain string, affinity *corev1.NodeSelectorRequirement) *corev1.Pod {
	spec := sleeperSpec(corev1.PodResourceClaim{Name: "gpus", ResourceClaimTemplateName: ptr.To(gpuTemplate)})
	spec.ResourceClaims = append(spec.ResourceClaims, corev1.PodResourceClaim{Name: "channel", ResourceClaimName: ptr.To(domain + "-channel")})
	spec.Containers[0].Resources.Claims = append(spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: "channel"})
	key, rest, _ := strings.Cut(env.trayTaint, "=")
	_, effect, _ := strings.Cut(rest, ":")
	spec.Tolerations = []corev1.Toleration{{Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffect(effect)}}
	if affinity != nil {
		spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{*affinity},
			}}},
		}}
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"domain": domain}}, Spec: spec}
}

// channelOf returns the channel device the domain's claim was allocated, and
// checks that it is from the clique's pool.
func channelOf(t *testing.T, ctx context.Context, ns, domain, clique string) string {
	t.Helper()
	claim, err := env.cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, domain+"-channel", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s/%s-channel: allocation %+v, want one channel", ns, domain, claim.Status.Allocation)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	if r.Driver != driverName || r.Pool != vocabulary.ChannelPoolName(clique) {
		t.Errorf("channel %s/%s/%s, want a device of pool %s", r.Driver, r.Pool, r.Device, vocabulary.ChannelPoolName(clique))
	}
	return r.Device
}

// podChannels lists the IMEX channel device nodes the pod's container sees:
// character devices, which the runtime made from the CDI spec's numbers.
func podChannels(t *testing.T, ctx context.Context, pod *corev1.Pod) []string {
	t.Helper()
	out, err := env.cluster.Exec(ctx, pod.Namespace, pod.Name, pod.Spec.Containers[0].Name, "sh", "-c",
		`for f in /dev/nvidia-caps-imex-channels/*; do if [ -c "$f" ]; then basename "$f"; fi; done`)
	if err != nil {
		t.Fatalf("list channels in %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	return strings.Fields(out)
}

// TestComputeDomainAcrossTrays: a domain of two pods x 4 GPUs spreads over the
// two trays of rack-a, gets one channel of that clique in both containers,
// and the two IMEX daemons connect; a third pod of the domain waits rather
// than use the free tray of the other rack; a pod that ends takes its node's
// daemon with it; an AfterLastPod domain goes away after its last pod.
func TestComputeDomainAcrossTrays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	clique, rack, other := rackTrays(t, ctx)
	ns := newNamespace(t, ctx, "e2e-compute-domain")
	claimTemplate(t, ctx, ns, "tray", resourceapi.ExactDeviceRequest{DeviceClassName: driverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 4})
	createDomain(t, ctx, ns, "train", &gpuv1beta1.ComputeDomainLifetime{Policy: gpuv1beta1.LifetimeAfterLastPod, GracePeriodSeconds: ptr.To[int32](5)})

	// The first worker is placed on rack-a by the user (the scheduler does not
	// pick the clique with room for the whole job: docs/compute-domains.md);
	// the second has no affinity: the channel claim's allocation keeps it in
	// the clique, on the other tray of rack-a.
	inRack := &corev1.NodeSelectorRequirement{Key: vocabulary.LabelClique, Operator: corev1.NodeSelectorOpIn, Values: []string{clique}}
	w0 := runPod(t, ctx, workerPod(ns, "worker-0", "tray", "train", inRack))
	w1 := runPod(t, ctx, workerPod(ns, "worker-1", "tray", "train", nil))
	got := []string{w0.Spec.NodeName, w1.Spec.NodeName}
	slices.Sort(got)
	if !slices.Equal(got, rack[:2]) {
		t.Errorf("workers on %v, want one on each tray of rack-a %v", got, rack)
	}
	channel := channelOf(t, ctx, ns, "train", clique)
	n, err := vocabulary.ChannelNumber(channel)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*corev1.Pod{w0, w1} {
		if got := podChannels(t, ctx, p); !slices.Equal(got, []string{fmt.Sprintf("channel%d", n)}) {
			t.Errorf("%s sees IMEX channels %v, want channel%d only", p.Name, got, n)
		}
	}
	cd := waitDomainReady(t, ctx, ns, "train", rack[:2]...)
	for _, node := range cd.Status.Nodes {
		if node.CliqueID != clique || node.Channel == nil || int(*node.Channel) != n || node.IPAddress == "" {
			t.Errorf("status of node %s: %+v, want clique %s, channel %d and an address", node.Name, node, clique, n)
		}
	}

	// A third worker has no tray of rack-a left; rack-b's tray has 4 free GPUs
	// but another clique: it must wait, unbound.
	third := workerPod(ns, "worker-2", "tray", "train", nil)
	if _, err := env.cluster.Client.CoreV1().Pods(ns).Create(ctx, third, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second)
	if p, err := env.cluster.Client.CoreV1().Pods(ns).Get(ctx, third.Name, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Errorf("worker-2 bound to %q (rack-b's tray is %s): the channel must keep the domain in clique %s (err %v)", p.Spec.NodeName, other, clique, err)
	}
	deletePod(t, ctx, ns, third.Name)

	// worker-1 ends: its node leaves the domain, the other stays Ready alone.
	deletePod(t, ctx, ns, w1.Name)
	waitDomainReady(t, ctx, ns, "train", w0.Spec.NodeName)

	// The last pod ends: the AfterLastPod domain and its claim go away.
	deletePod(t, ctx, ns, w0.Name)
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		_, err := getDomain(ctx, ns, "train")
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Errorf("AfterLastPod domain still there 2 minutes after its last pod: %v", err)
	}
}

// TestComputeDomainsShareNoChannel: two domains on the two trays of one rack
// get different channels of its clique, each tray runs its own domain's
// daemon, and a pod of a third domain is refused by a tray that serves
// another (one IMEX domain per node), with the reason in its events.
func TestComputeDomainsShareNoChannel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	clique, rack, _ := rackTrays(t, ctx)
	ns := newNamespace(t, ctx, "e2e-compute-domains")
	claimTemplate(t, ctx, ns, "one", resourceapi.ExactDeviceRequest{DeviceClassName: driverName})
	var channels []string
	for i, name := range []string{"a", "b"} {
		createDomain(t, ctx, ns, name, nil)
		on := &corev1.NodeSelectorRequirement{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{rack[i]}}
		runPod(t, ctx, workerPod(ns, "worker-"+name, "one", name, on))
		channels = append(channels, channelOf(t, ctx, ns, name, clique))
		waitDomainReady(t, ctx, ns, name, rack[i])
	}
	if channels[0] == channels[1] {
		t.Errorf("domains a and b share channel %s", channels[0])
	}

	createDomain(t, ctx, ns, "c", nil)
	on := &corev1.NodeSelectorRequirement{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{rack[0]}}
	pod := workerPod(ns, "worker-c", "one", "c", on)
	if _, err := env.cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var evs []string
	if err := poll(ctx, func(ctx context.Context) (bool, error) {
		evs, _ = env.runner.PodEvents(ctx, ns, pod.Name)
		return slices.ContainsFunc(evs, func(e string) bool { return strings.Contains(e, "FailedPrepareDynamicResources") }), nil
	}); err != nil {
		t.Fatalf("worker-c on %s (serving domain a) was not refused: events %v", rack[0], evs)
	}
	t.Logf("worker-c refused: %s", strings.Join(evs, "; "))
	if p, _ := env.cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); p != nil && p.Status.Phase == corev1.PodRunning {
		t.Errorf("worker-c runs on a tray that serves domain a")
	}
}
