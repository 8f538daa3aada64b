package modelclasses

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const driver = "gpu.dra.dev"

var everything = labels.Everything()

func TestMain(m *testing.M) { os.Exit(simnode.Main(m)) }

func TestClassName(t *testing.T) {
	for product, want := range map[string]string{
		"NVIDIA H100 80GB HBM3":   "nvidia-h100-80gb-hbm3.gpu.dra.dev",
		"NVIDIA A100-SXM4-40GB":   "nvidia-a100-sxm4-40gb.gpu.dra.dev",
		"NVIDIA L4":               "nvidia-l4.gpu.dra.dev",
		"NVIDIA RTX 6000 Ada (x)": "nvidia-rtx-6000-ada-x.gpu.dra.dev",
		"  ":                      "",
	} {
		if got := ClassName(driver, product); got != want {
			t.Errorf("ClassName(%q) = %q, want %q", product, got, want)
		}
	}
}

// TestSelectorsMatchTheirModel evaluates each class's CEL selector, as the
// scheduler does, against every device of every simulated machine: a class
// selects exactly the whole GPUs of its model.
func TestSelectorsMatchTheirModel(t *testing.T) {
	var all []*resourceapi.ResourceSlice
	for _, m := range []string{"dgxh100", "dgxa100", "l4x4"} {
		all = append(all, simnode.New(t, m, "node-"+m).Slices(driver)...)
	}
	products := Products(driver, all)
	if want := []string{"NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3", "NVIDIA L4"}; !slices.Equal(products, want) {
		t.Fatalf("products %q, want %q", products, want)
	}
	classes := DeviceClasses(driver, products)
	if len(classes) != 3 {
		t.Fatalf("%d classes", len(classes))
	}
	for _, dc := range classes {
		product := dc.Annotations[ProductAnnotation(driver)]
		if dc.Name != ClassName(driver, product) || dc.Labels[ModelClassLabel(driver)] != "true" || dc.Labels[ManagedByLabel] != ManagedByValue {
			t.Errorf("class %s: labels %v annotations %v", dc.Name, dc.Labels, dc.Annotations)
		}
		checkSelects(t, dc, all, func(d resourceapi.Device) bool {
			return vocabulary.Kind(*d.Attributes[vocabulary.AttrType].StringValue) == vocabulary.KindGPU &&
				*d.Attributes[vocabulary.AttrProductName].StringValue == product
		})
	}
}

// checkSelects evaluates the class's CEL selector, as the scheduler does,
// against every device of the slices: it must match exactly the devices
// want accepts, and at least one.
func checkSelects(t *testing.T, dc *resourceapi.DeviceClass, all []*resourceapi.ResourceSlice, want func(resourceapi.Device) bool) {
	t.Helper()
	compiler := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true})
	prog := compiler.CompileCELExpression(dc.Spec.Selectors[0].CEL.Expression, dracel.Options{})
	if prog.Error != nil {
		t.Fatalf("class %s: %v", dc.Name, prog.Error)
	}
	matched := 0
	for _, s := range all {
		for _, d := range s.Spec.Devices {
			ok, _, err := prog.DeviceMatches(context.Background(), dracel.Device{
				Driver: driver, Attributes: d.Attributes, Capacity: d.Capacity, AllowMultipleAllocations: d.AllowMultipleAllocations,
			})
			if err != nil {
				t.Fatalf("class %s on %s: %v", dc.Name, d.Name, err)
			}
			if w := want(d); ok != w {
				t.Errorf("class %s matches %s/%s: %v, want %v", dc.Name, *s.Spec.NodeName, d.Name, ok, w)
			}
			if ok {
				matched++
			}
		}
	}
	if matched == 0 {
		t.Errorf("class %s matches no device", dc.Name)
	}
}

func TestCollidingProductsShareAClass(t *testing.T) {
	classes := DeviceClasses(driver, []string{"NVIDIA X-1", "NVIDIA X 1"})
	if len(classes) != 1 {
		t.Fatalf("%d classes", len(classes))
	}
	want := `device.driver == "gpu.dra.dev" && device.attributes["gpu.dra.dev"].type == "gpu" && ` +
		`(device.attributes["gpu.dra.dev"].productName == "NVIDIA X 1" || device.attributes["gpu.dra.dev"].productName == "NVIDIA X-1")`
	if got := classes[0].Spec.Selectors[0].CEL.Expression; got != want {
		t.Errorf("selector\n got %s\nwant %s", got, want)
	}
}

type env struct {
	client *fake.Clientset
	clock  *testingclock.FakeClock
	c      *Controller
	ctx    context.Context
}

// setup starts informers (not the controller's loop: tests call Sync).
func setup(t *testing.T, grace time.Duration, objs ...*resourceapi.DeviceClass) *env {
	t.Helper()
	return setupWith(t, Options{DriverName: driver, Models: true, GracePeriod: grace}, objs...)
}

// setupWith is setup with other options (the clock is the test's).
func setupWith(t *testing.T, opts Options, objs ...*resourceapi.DeviceClass) *env {
	t.Helper()
	client := fake.NewClientset()
	for _, o := range objs {
		if _, err := client.ResourceV1().DeviceClasses().Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	clk := testingclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	opts.Clock = clk
	c, err := New(client, factory.Resource().V1().ResourceSlices(), factory.Resource().V1().DeviceClasses(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	if !cache.WaitForCacheSync(ctx.Done(), c.cacheSynced...) {
		t.Fatal("caches not synced")
	}
	return &env{client: client, clock: clk, c: c, ctx: ctx}
}

func (e *env) publish(t *testing.T, machine, node string) {
	t.Helper()
	for i, s := range simnode.New(t, machine, node).Slices(driver) {
		s.Name = fmt.Sprintf("%s-%d", node, i)
		if _, err := e.client.ResourceV1().ResourceSlices().Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *env) unpublish(t *testing.T, node string) {
	t.Helper()
	list, _ := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	for _, s := range list.Items {
		if *s.Spec.NodeName == node {
			if err := e.client.ResourceV1().ResourceSlices().Delete(e.ctx, s.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// sync waits for the informers to see nSlices slices and the classes
// written so far, then syncs.
func (e *env) sync(t *testing.T, nSlices int) time.Duration {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		slices, _ := e.c.slices.List(everything)
		list, _ := e.client.ResourceV1().DeviceClasses().List(e.ctx, metav1.ListOptions{})
		cached, _ := e.c.classes.List(everything)
		if len(slices) == nSlices && len(cached) == len(list.Items) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("informers did not catch up: %d slices, want %d", len(slices), nSlices)
		}
		time.Sleep(5 * time.Millisecond)
	}
	recheck, err := e.c.Sync(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return recheck
}

func (e *env) classNames(t *testing.T) []string {
	t.Helper()
	list, err := e.client.ResourceV1().DeviceClasses().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, dc := range list.Items {
		names = append(names, dc.Name)
	}
	slices.Sort(names)
	return names
}

const (
	h100Class = "nvidia-h100-80gb-hbm3.gpu.dra.dev"
	l4Class   = "nvidia-l4.gpu.dra.dev"
)

func TestControllerCreatesAndDeletes(t *testing.T) {
	e := setup(t, 0)
	e.publish(t, "dgxh100", "node-a")
	e.publish(t, "l4x4", "node-b")
	e.publish(t, "l4x4", "node-c")
	n := len(simnode.New(t, "dgxh100", "x").Slices(driver)) + 2*len(simnode.New(t, "l4x4", "x").Slices(driver))
	e.sync(t, n)
	if got := e.classNames(t); !slices.Equal(got, []string{h100Class, l4Class}) {
		t.Fatalf("classes %v", got)
	}

	// One of two L4 nodes goes: the model is still there.
	e.unpublish(t, "node-b")
	n -= len(simnode.New(t, "l4x4", "x").Slices(driver))
	e.sync(t, n)
	if got := e.classNames(t); !slices.Equal(got, []string{h100Class, l4Class}) {
		t.Fatalf("classes %v", got)
	}

	// The last L4 goes: its class goes.
	e.unpublish(t, "node-c")
	n -= len(simnode.New(t, "l4x4", "x").Slices(driver))
	e.sync(t, n)
	if got := e.classNames(t); !slices.Equal(got, []string{h100Class}) {
		t.Fatalf("classes %v", got)
	}
}

func TestControllerGracePeriod(t *testing.T) {
	e := setup(t, 5*time.Minute)
	e.publish(t, "l4x4", "node-a")
	n := len(simnode.New(t, "l4x4", "x").Slices(driver))
	e.sync(t, n)
	e.unpublish(t, "node-a")
	if recheck := e.sync(t, 0); recheck != 5*time.Minute {
		t.Errorf("recheck after %v, want the grace period", recheck)
	}
	e.clock.Step(4 * time.Minute)
	if recheck := e.sync(t, 0); recheck != time.Minute {
		t.Errorf("recheck after %v, want 1m", recheck)
	}
	if got := e.classNames(t); !slices.Equal(got, []string{l4Class}) {
		t.Fatalf("class deleted within the grace period: %v", got)
	}

	// The node comes back within the grace period: the clock restarts.
	e.publish(t, "l4x4", "node-a")
	e.sync(t, n)
	e.unpublish(t, "node-a")
	e.clock.Step(2 * time.Minute)
	e.sync(t, 0)
	if got := e.classNames(t); !slices.Equal(got, []string{l4Class}) {
		t.Fatalf("class deleted although its model came back: %v", got)
	}
	e.clock.Step(5 * time.Minute)
	e.sync(t, 0)
	if got := e.classNames(t); len(got) != 0 {
		t.Fatalf("class not deleted after the grace period: %v", got)
	}
}

func TestControllerRepairsDriftAndLeavesOthersAlone(t *testing.T) {
	foreign := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: l4Class},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: "true"}}}}}
	unrelated := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.dra.dev"}}
	drifted := DeviceClasses(driver, []string{"NVIDIA H100 80GB HBM3"})[0]
	drifted.Spec.Selectors[0].CEL.Expression = "false"
	drifted.Annotations["keep"] = "me"
	e := setup(t, 0, foreign, unrelated, drifted)

	e.publish(t, "l4x4", "node-a")
	e.publish(t, "dgxh100", "node-b")
	e.sync(t, len(simnode.New(t, "l4x4", "x").Slices(driver))+len(simnode.New(t, "dgxh100", "x").Slices(driver)))

	got, _ := e.client.ResourceV1().DeviceClasses().Get(e.ctx, l4Class, metav1.GetOptions{})
	if got.Spec.Selectors[0].CEL.Expression != "true" || got.Labels != nil {
		t.Errorf("a class of the same name that is not managed here was changed: %+v", got)
	}
	got, _ = e.client.ResourceV1().DeviceClasses().Get(e.ctx, h100Class, metav1.GetOptions{})
	want := DeviceClasses(driver, []string{"NVIDIA H100 80GB HBM3"})[0]
	if got.Spec.Selectors[0].CEL.Expression != want.Spec.Selectors[0].CEL.Expression || got.Annotations["keep"] != "me" {
		t.Errorf("drifted class not repaired (or foreign annotation lost): %+v", got)
	}

	// Everything leaves: only the managed class goes.
	e.unpublish(t, "node-a")
	e.unpublish(t, "node-b")
	e.sync(t, 0)
	if names := e.classNames(t); !slices.Equal(names, []string{"gpu.dra.dev", l4Class}) {
		t.Errorf("classes %v", names)
	}
}

func TestControllerRun(t *testing.T) {
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	c, err := New(client, factory.Resource().V1().ResourceSlices(), factory.Resource().V1().DeviceClasses(), Options{DriverName: driver, Models: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for i, s := range simnode.New(t, "dgxa100", "node-a").Slices(driver) {
		s.Name = fmt.Sprintf("s-%d", i)
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := client.ResourceV1().DeviceClasses().Get(ctx, "nvidia-a100-sxm4-40gb.gpu.dra.dev", metav1.GetOptions{}); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("class not created within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
