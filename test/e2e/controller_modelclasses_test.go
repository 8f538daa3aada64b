package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/clusternodes"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/modelclasses"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// fakeNodeLabel marks the simulated nodes (and their slices) of these tests.
const fakeNodeLabel = "e2e.gpu.dra.dev/fake-node"

// TestControllerModelDeviceClasses: with controller.modelDeviceClasses the
// leader keeps a DeviceClass for the node's GPU model, selecting exactly its
// whole GPUs; a node with another model (a simulated node without kubelet,
// internal/standin/clusternodes; E2E_PLUGIN is the plugin whose --print-slices it
// publishes, default bin/dra-kubelet-plugin) gets its class, which the
// scheduler allocates on that node only; when the node and its slices go, its
// class is deleted after controller.modelDeviceClassGracePeriod while the
// real node's class stays. The new node also gets its GFD labels.
func TestControllerModelDeviceClasses(t *testing.T) {
	ctx := testContext(t)
	const grace = 15 * time.Second
	client := env.cluster.Client
	managed := modelclasses.ModelClassLabel(driverName) + "=true"
	// Turning the option off leaves the classes: remove them once the release
	// is restored (cleanups run last in, first out).
	t.Cleanup(func() {
		err := client.ResourceV1().DeviceClasses().DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: managed})
		if err != nil {
			t.Errorf("delete the per-model classes: %v", err)
		}
	})
	saveRelease(t, ctx)
	upgradeRelease(t, ctx, "--set", "controller.modelDeviceClasses=true", "--set", "controller.modelDeviceClassGracePeriod="+grace.String())

	realProduct := product(t, nodeSlices(t, ctx, env.node))
	realClass := waitModelClass(t, ctx, realProduct)
	checkSelectsModel(t, ctx, realClass, realProduct)

	// Another model appears.
	machine := "dgxa100"
	if env.simulate == machine {
		machine = "l4x4"
	}
	slicesFor, err := clusternodes.PrintSlices(ctx, getenv("E2E_PLUGIN", filepath.Join(env.repoRoot, "bin", "dra-kubelet-plugin")), machine, "")
	if err != nil {
		t.Fatal(err)
	}
	fake := "e2e-fake-" + machine
	removeFake := func(ctx context.Context) error {
		return clusternodes.Remove(ctx, client, fakeNodeLabel, []string{fake})
	}
	t.Cleanup(func() {
		if err := removeFake(context.Background()); err != nil {
			t.Error(err)
		}
	})
	fakeSlices := slicesFor(fake)
	if err := clusternodes.Add(ctx, client, fake, map[string]string{fakeNodeLabel: "true"}, fakeSlices); err != nil {
		t.Fatal(err)
	}
	stopLeases := clusternodes.RenewLeases(ctx, client, []string{fake})
	defer stopLeases()
	fakeProduct := product(t, fakeSlices)
	if fakeProduct == realProduct {
		t.Fatalf("simulated %s has the node's model %s", machine, realProduct)
	}
	// The node labels follow the new node's slices, too.
	if got, want, err := env.runner.WaitGFDLabels(ctx, fake); err != nil {
		t.Errorf("GFD labels of %s: %v: %v", fake, err, scenarios.LabelDiff(got, want))
	}
	fakeClass := waitModelClass(t, ctx, fakeProduct)
	checkSelectsModel(t, ctx, fakeClass, fakeProduct)
	allocateOnClass(t, ctx, fakeClass.Name, fake)

	// The model leaves the cluster.
	stopLeases()
	removed := time.Now()
	if err := removeFake(ctx); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, grace+time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.ResourceV1().DeviceClasses().Get(ctx, fakeClass.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("class %s of the gone model not deleted: %v", fakeClass.Name, err)
	}
	if d := time.Since(removed); d < grace {
		t.Errorf("class %s deleted %v after its model left, before the grace period %v", fakeClass.Name, d, grace)
	} else {
		t.Logf("class %s deleted %v after its model left (grace period %v)", fakeClass.Name, d.Round(100*time.Millisecond), grace)
	}
	if dc, err := client.ResourceV1().DeviceClasses().Get(ctx, realClass.Name, metav1.GetOptions{}); err != nil || dc.UID != realClass.UID {
		t.Errorf("class %s of the node's model did not stay: %v", realClass.Name, err)
	}
}

// nodeSlices are the driver's ResourceSlices of a node.
func nodeSlices(t *testing.T, ctx context.Context, node string) []*resourceapi.ResourceSlice {
	t.Helper()
	list, err := env.cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driverName + ",spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*resourceapi.ResourceSlice, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out
}

// product is the single GPU model of the slices.
func product(t *testing.T, slices []*resourceapi.ResourceSlice) string {
	t.Helper()
	products := modelclasses.Products(driverName, slices)
	if len(products) != 1 {
		t.Fatalf("want one GPU model in the slices, have %q", products)
	}
	return products[0]
}

// waitModelClass waits for the managed class of the product.
func waitModelClass(t *testing.T, ctx context.Context, product string) *resourceapi.DeviceClass {
	t.Helper()
	name := modelclasses.ClassName(driverName, product)
	var dc *resourceapi.DeviceClass
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		dc, err = env.cluster.Client.ResourceV1().DeviceClasses().Get(ctx, name, metav1.GetOptions{})
		return err == nil && dc.Labels[modelclasses.ModelClassLabel(driverName)] == "true", nil
	})
	if err != nil {
		t.Fatalf("no managed DeviceClass %s for %s: %v", name, product, err)
	}
	t.Logf("DeviceClass %s: %s", name, dc.Spec.Selectors[0].CEL.Expression)
	return dc
}

// checkSelectsModel evaluates the class's selector, as the scheduler does,
// against every device the driver publishes in the cluster: it must select
// exactly the whole GPUs of product.
func checkSelectsModel(t *testing.T, ctx context.Context, dc *resourceapi.DeviceClass, product string) {
	t.Helper()
	if len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil {
		t.Fatalf("class %s: want one CEL selector, have %+v", dc.Name, dc.Spec.Selectors)
	}
	prog := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true}).CompileCELExpression(dc.Spec.Selectors[0].CEL.Expression, dracel.Options{})
	if prog.Error != nil {
		t.Fatalf("class %s: %v", dc.Name, prog.Error)
	}
	slices, err := env.cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driverName})
	if err != nil {
		t.Fatal(err)
	}
	matched := 0
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			ok, _, err := prog.DeviceMatches(ctx, dracel.Device{Driver: driverName, Attributes: d.Attributes, Capacity: d.Capacity, AllowMultipleAllocations: d.AllowMultipleAllocations})
			if err != nil {
				t.Fatalf("class %s on %s/%s: %v", dc.Name, s.Spec.Pool.Name, d.Name, err)
			}
			typ, prod := d.Attributes[vocabulary.AttrType].StringValue, d.Attributes[vocabulary.AttrProductName].StringValue
			if want := vocabulary.Kind(ptr.Deref(typ, "")) == vocabulary.KindGPU && ptr.Deref(prod, "") == product; ok != want {
				t.Errorf("class %s selects %s/%s (%s %s): %v, want %v", dc.Name, s.Spec.Pool.Name, d.Name, ptr.Deref(typ, ""), ptr.Deref(prod, ""), ok, want)
			}
			if ok {
				matched++
			}
		}
	}
	if matched == 0 {
		t.Errorf("class %s selects no device", dc.Name)
	}
}

// allocateOnClass schedules a pod with a claim for class and checks that the
// scheduler bound it to node and allocated the claim from node's devices.
// node has no kubelet: the pod never runs and is deleted at once.
func allocateOnClass(t *testing.T, ctx context.Context, class, node string) {
	t.Helper()
	ns := newNamespace(t, ctx, "e2e-model-class")
	claimTemplate(t, ctx, ns, "gpu", resourceapi.ExactDeviceRequest{DeviceClassName: class})
	pods := env.cluster.Client.CoreV1().Pods(ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "by-class"},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "dev", ResourceClaimTemplateName: ptr.To("gpu")}},
			Containers: []corev1.Container{{
				Name: "ctr", Image: "gdd.local/demo:v1", Command: []string{"sleep", "86400"},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}},
			}},
		},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Errorf("delete pod %s/%s: %v", ns, pod.Name, err)
		}
	}()
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		pod, err = pods.Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && pod.Spec.NodeName != "", nil
	})
	if err != nil {
		evs, _ := env.runner.PodEvents(ctx, ns, pod.Name)
		t.Fatalf("pod with a claim for %s not scheduled: %v; events: %v", class, err, evs)
	}
	if pod.Spec.NodeName != node {
		t.Fatalf("pod with a claim for %s scheduled to %s, want %s", class, pod.Spec.NodeName, node)
	}
	claim := podClaim(t, ctx, pod)
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) == 0 {
		t.Fatalf("claim %s not allocated: %+v", claim.Name, claim.Status)
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driverName || r.Pool != node {
			t.Errorf("claim for %s allocated %s/%s/%s, want a device of node %s", class, r.Driver, r.Pool, r.Device, node)
		}
	}
	t.Logf("claim for %s allocated on %s: %v", class, node, claim.Status.Allocation.Devices.Results)
}
