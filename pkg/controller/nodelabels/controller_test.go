package nodelabels

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8smetrics "k8s.io/component-base/metrics"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/internal/metricstest"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

type env struct {
	client *fake.Clientset
	reg    k8smetrics.KubeRegistry
}

// start runs the controller against a fake clientset holding objs.
func start(t *testing.T, objs ...*corev1.Node) *env {
	t.Helper()
	client := fake.NewClientset()
	for _, n := range objs {
		if _, err := client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	reg := k8smetrics.NewKubeRegistry()
	m := metrics.New()
	m.MustRegister(reg)
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(client, factory.Resource().V1().ResourceSlices(), factory.Core().V1().Nodes(), Options{DriverName: driver, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx, 2); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		factory.Shutdown()
	})
	return &env{client: client, reg: reg}
}

func node(name string, labels, annotations map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations}}
}

// publish creates the slices a simulated machine publishes for node name.
func (e *env) publish(t *testing.T, machine, name string) []*resourceapi.ResourceSlice {
	t.Helper()
	slices := simnode.New(t, machine, name).Slices(driver)
	e.create(t, machine, slices)
	return slices
}

func (e *env) create(t *testing.T, prefix string, slices []*resourceapi.ResourceSlice) {
	t.Helper()
	for i, s := range slices {
		s = s.DeepCopy()
		s.Name = fmt.Sprintf("%s-%s-%d", *s.Spec.NodeName, prefix, i)
		if _, err := e.client.ResourceV1().ResourceSlices().Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *env) deleteSlices(t *testing.T) {
	t.Helper()
	list, err := e.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list.Items {
		if err := e.client.ResourceV1().ResourceSlices().Delete(context.Background(), s.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFor polls the node until cond holds.
func (e *env) waitFor(t *testing.T, name, what string, cond func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	var last *corev1.Node
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := e.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = n
		return cond(n), nil
	})
	if err != nil {
		t.Fatalf("node %s: %s: %v; labels %v, annotations %v", name, what, err, last.Labels, last.Annotations)
	}
	return last
}

// hasExactly says whether the node carries exactly want among the labels
// the controller may own, plus the foreign labels in keep.
func hasExactly(want, keep map[string]string) func(*corev1.Node) bool {
	return func(n *corev1.Node) bool {
		all := map[string]string{}
		maps.Copy(all, want)
		maps.Copy(all, keep)
		return maps.Equal(n.Labels, all)
	}
}

func owned(n *corev1.Node) []string {
	v, ok := n.Annotations[OwnedAnnotation(driver)]
	if !ok {
		return nil
	}
	return strings.Split(v, ",")
}

func TestControllerFollowsSlices(t *testing.T) {
	keep := map[string]string{"kubernetes.io/hostname": "node-a"}
	e := start(t, node("node-a", keep, nil), node("node-b", nil, nil))

	// Published slices: labels appear; other nodes are untouched.
	h100 := e.publish(t, "dgxh100", "node-a")
	want := Labels(driver, h100)
	if want[LabelProduct] != "NVIDIA-H100-80GB-HBM3" || want[vocabulary.LabelClique] == "" { // NVSwitch: one clique
		t.Fatalf("unexpected labels %v", want)
	}
	n := e.waitFor(t, "node-a", "H100 labels", hasExactly(want, keep))
	if got := owned(n); len(got) != len(want) {
		t.Errorf("owned annotation lists %d labels, want %d: %v", len(got), len(want), got)
	}
	if b, _ := e.client.CoreV1().Nodes().Get(context.Background(), "node-b", metav1.GetOptions{}); len(b.Labels) != 0 {
		t.Errorf("node-b labelled: %v", b.Labels)
	}
	set := metricstest.Value(t, e.reg, "gpu_dra_controller_node_labels_written_total", map[string]string{"action": metrics.ActionSet})
	if set < float64(len(want)) { // more when the slices arrived one by one
		t.Errorf("labels set metric = %v, want at least %d", set, len(want))
	}

	// The node publishes only MIG devices now: a label no longer derived
	// (memory) goes.
	e.deleteSlices(t)
	migOnly := filterDevices(h100, func(d *resourceapi.Device) bool { return deviceType(d) == vocabulary.KindMIG })
	e.create(t, "mig", migOnly)
	want = Labels(driver, migOnly)
	if _, ok := want[LabelMemory]; ok || want[LabelProduct] != "NVIDIA-H100-80GB-HBM3" {
		t.Fatalf("unexpected labels %v", want)
	}
	e.waitFor(t, "node-a", "memory label removed", hasExactly(want, keep))

	// Other GPUs: the labels follow.
	e.deleteSlices(t)
	tsOnly := filterDevices(simnode.New(t, "l4x4", "node-a").Slices(driver), func(d *resourceapi.Device) bool {
		return deviceType(d) == vocabulary.KindTimeSlice
	})
	e.create(t, "l4", tsOnly)
	want = Labels(driver, tsOnly)
	if want[LabelProduct] != "NVIDIA-L4" || want[LabelSharingStrategy] != SharingTimeSlicing || want[LabelMemory] != "23034" ||
		want[vocabulary.LabelClique] != "" { // no fabric: the clique label goes

		t.Fatalf("unexpected labels %v", want)
	}
	e.waitFor(t, "node-a", "L4 labels", hasExactly(want, keep))

	// The slices go: every label the controller wrote goes, the others stay.
	e.deleteSlices(t)
	n = e.waitFor(t, "node-a", "labels removed", hasExactly(nil, keep))
	if _, ok := n.Annotations[OwnedAnnotation(driver)]; ok {
		t.Errorf("owned annotation left: %v", n.Annotations)
	}
	if removed := metricstest.Value(t, e.reg, "gpu_dra_controller_node_labels_written_total", map[string]string{"action": metrics.ActionRemove}); removed == 0 {
		t.Error("no removals counted")
	}
}

func TestControllerOptOut(t *testing.T) {
	key := OptOutKey(driver)
	optOut := map[string]string{key: OptOutValue}
	e := start(t, node("node-a", optOut, nil))
	want := Labels(driver, e.publish(t, "dgxa100", "node-a"))

	// Opted out by label: nothing is written. Give the controller time.
	time.Sleep(200 * time.Millisecond)
	n, _ := e.client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if !maps.Equal(n.Labels, optOut) || len(n.Annotations) != 0 {
		t.Fatalf("opted-out node changed: labels %v annotations %v", n.Labels, n.Annotations)
	}

	// Opt-out label removed: labels come.
	n.Labels = nil
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(t, "node-a", "labels after opting in", hasExactly(want, nil))

	// Opt-out by annotation: the controller's labels go.
	n, _ = e.client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	n.Annotations[key] = OptOutValue
	if _, err := e.client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n = e.waitFor(t, "node-a", "labels removed after opting out", hasExactly(nil, nil))
	if !maps.Equal(n.Annotations, optOut) {
		t.Errorf("annotations %v, want only the opt-out", n.Annotations)
	}
}

func TestControllerLeavesForeignLabels(t *testing.T) {
	// An admin (or GFD through NFD) set the product label; the controller
	// neither overwrites nor removes it, and does not claim it.
	foreign := map[string]string{LabelProduct: "my-product"}
	e := start(t, node("node-a", foreign, nil))
	want := Labels(driver, e.publish(t, "l4x4", "node-a"))
	delete(want, LabelProduct)
	n := e.waitFor(t, "node-a", "labels except the foreign one", hasExactly(want, foreign))
	for _, k := range owned(n) {
		if k == LabelProduct {
			t.Error("foreign label listed as owned")
		}
	}
	e.deleteSlices(t)
	e.waitFor(t, "node-a", "own labels removed, foreign kept", hasExactly(nil, foreign))
}

func TestControllerNodeAfterSlices(t *testing.T) {
	e := start(t)
	want := Labels(driver, e.publish(t, "dgxh100", "node-late"))
	if _, err := e.client.CoreV1().Nodes().Create(context.Background(), node("node-late", nil, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(t, "node-late", "labels on a node that came after its slices", hasExactly(want, nil))
}

func TestControllerIgnoresOtherDrivers(t *testing.T) {
	e := start(t, node("node-a", nil, nil))
	e.create(t, "other", otherDriver(simnode.New(t, "dgxh100", "node-a").Slices(driver)))
	time.Sleep(200 * time.Millisecond)
	n, _ := e.client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	if len(n.Labels) != 0 || len(n.Annotations) != 0 {
		t.Errorf("labelled from another driver's slices: %v %v", n.Labels, n.Annotations)
	}
}

func TestStripNode(t *testing.T) {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"c": "d"}, ResourceVersion: "7"},
		Status:     corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"big"}}}},
	}
	out, _ := StripNode(n)
	s := out.(*corev1.Node)
	if s.Name != "n" || s.Labels["a"] != "b" || s.Annotations["c"] != "d" || s.ResourceVersion != "7" || len(s.Status.Images) != 0 {
		t.Errorf("stripped node %+v", s)
	}
}
