package nodeoutage

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
	k8smetrics "k8s.io/component-base/metrics"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/internal/metricstest"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const (
	ns    = "gpu-dra-driver"
	node  = "gpu-node-1"
	grace = 40 * time.Second
)

func nodeObj() *corev1.Node { return nodeNamed(node) }

func nodeNamed(n string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}} }

func sliceObj() *resourceapi.ResourceSlice { return sliceNamed(node) }

func sliceNamed(n string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: n + "-gpu.dra.dev-abcde"},
		Spec: resourceapi.ResourceSliceSpec{Driver: vocabulary.DriverName, NodeName: ptr.To(n),
			Pool: resourceapi.ResourcePool{Name: n, ResourceSliceCount: 1}},
	}
}

// otherDriverSlice is in the node's pool of another driver: the shared
// slice informer need not be filtered to the driver, so it must not count.
func otherDriverSlice() *resourceapi.ResourceSlice {
	s := sliceObj()
	s.Name, s.Spec.Driver = node+"-other.example.com-fghij", "other.example.com"
	return s
}

// leaseObj was renewed at renewed (the plugin's clock, which the
// controller does not compare with its own).
func leaseObj(renewed time.Time) *coordinationv1.Lease { return leaseNamed(node, renewed) }

func leaseNamed(n string, renewed time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: vocabulary.HeartbeatLeaseName(n), Namespace: ns,
			Labels: map[string]string{vocabulary.LabelHeartbeat: "true"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("plugin-abc"), RenewTime: ptr.To(metav1.NewMicroTime(renewed))},
	}
}

func ruleObj(effect resourceapi.DeviceTaintEffect) *resourceapi.DeviceTaintRule {
	return &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: vocabulary.OutageRuleName(node), Labels: map[string]string{vocabulary.LabelOutage: "true"}},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(vocabulary.DriverName), Pool: ptr.To(node)},
			Taint:          resourceapi.DeviceTaint{Key: vocabulary.OutageTaintKey, Value: vocabulary.OutageTaintValue, Effect: effect},
		},
	}
}

// served makes the fake discovery list DeviceTaintRules, or not.
func served(client *fake.Clientset, yes bool) {
	list := &metav1.APIResourceList{GroupVersion: resourceapi.SchemeGroupVersion.String(),
		APIResources: []metav1.APIResource{{Name: "resourceslices"}}}
	if yes {
		list.APIResources = append(list.APIResources, metav1.APIResource{Name: "devicetaintrules"})
	}
	client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{list}
}

// driverSlices is a factory for the driver's slices, as pkg/controller
// shares one among its controllers.
func driverSlices(client *fake.Clientset) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = resourceapi.ResourceSliceSelectorDriver + "=" + vocabulary.DriverName
	}))
}

type fixture struct {
	t      *testing.T
	client *fake.Clientset
	clock  *testingclock.FakeClock
	c      *Controller
	reg    k8smetrics.KubeRegistry
	events chan string
}

func newFixture(t *testing.T, opts Options, objs ...runtime.Object) *fixture {
	t.Helper()
	client := fake.NewClientset(objs...)
	served(client, true)
	reg := k8smetrics.NewKubeRegistry()
	m := metrics.New()
	m.MustRegister(reg)
	clk := testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	opts.DriverName, opts.Namespace, opts.Clock, opts.Metrics = vocabulary.DriverName, ns, clk, m
	rec := events.NewFakeRecorder(100)
	opts.Recorder = rec
	if opts.GracePeriod == 0 {
		opts.GracePeriod = grace
	}
	if opts.MassLapseThreshold == 0 {
		opts.MassLapseThreshold, opts.MassLapseMinNodes = DefaultMassLapseThreshold, DefaultMassLapseMinNodes
	}
	sliceFactory := driverSlices(client)
	c, err := New(client, sliceFactory.Resource().V1().ResourceSlices(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factories, synced, err := c.informers()
	if err != nil {
		t.Fatal(err)
	}
	factories = append(factories, sliceFactory)
	t.Cleanup(func() { // the informers stop only once ctx is canceled
		cancel()
		for _, f := range factories {
			f.Shutdown()
		}
	})
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	for _, s := range synced {
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return s(), nil }); err != nil {
			t.Fatal("caches not synced")
		}
	}
	c.prime() // as Run does once the caches are synced
	return &fixture{t: t, client: client, clock: clk, c: c, reg: reg, events: rec.Events}
}

// settle waits until the caches hold what the fake API server holds.
func (f *fixture) settle() {
	f.t.Helper()
	ctx := context.Background()
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		// The fake API server keeps no resourceVersions: compare whole objects.
		same := func(obj runtime.Object, err error, cached any, ok bool, _ error) bool {
			if apierrors.IsNotFound(err) || !ok {
				return apierrors.IsNotFound(err) && !ok
			}
			return apiequality.Semantic.DeepEqual(obj, cached)
		}
		for _, n := range f.nodes() {
			l, lerr := f.client.CoordinationV1().Leases(ns).Get(ctx, vocabulary.HeartbeatLeaseName(n), metav1.GetOptions{})
			r, rerr := f.client.ResourceV1().DeviceTaintRules().Get(ctx, vocabulary.OutageRuleName(n), metav1.GetOptions{})
			cl, lok, lcerr := f.c.leases.GetByKey(ns + "/" + vocabulary.HeartbeatLeaseName(n))
			cr, rok, rcerr := f.c.rules.GetByKey(vocabulary.OutageRuleName(n))
			if !same(l, lerr, cl, lok, lcerr) || !same(r, rerr, cr, rok, rcerr) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		f.t.Fatal("caches did not catch up with the API server")
	}
}

// nodes are the names of the Node objects in the API server.
func (f *fixture) nodes() []string {
	f.t.Helper()
	list, err := f.client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	out := []string{node} // also after its deletion
	for _, n := range list.Items {
		if n.Name != node {
			out = append(out, n.Name)
		}
	}
	return out
}

func (f *fixture) sync() time.Duration { f.t.Helper(); return f.syncNode(node) }

func (f *fixture) syncNode(n string) time.Duration {
	f.t.Helper()
	f.settle()
	recheck, err := f.c.Sync(context.Background(), n)
	if err != nil {
		f.t.Fatalf("Sync: %v", err)
	}
	f.settle()
	return recheck
}

// renew writes a new renewTime, as the plugin does.
func (f *fixture) renew() { f.t.Helper(); f.renewNode(node) }

func (f *fixture) renewNode(n string) {
	f.t.Helper()
	ctx := context.Background()
	l, err := f.client.CoordinationV1().Leases(ns).Get(ctx, vocabulary.HeartbeatLeaseName(n), metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(l.Spec.RenewTime.Add(10 * time.Second)))
	if _, err := f.client.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// effect is the node's rule's effect, "" without one.
func (f *fixture) effect() resourceapi.DeviceTaintEffect { f.t.Helper(); return f.effectOf(node) }

func (f *fixture) effectOf(n string) resourceapi.DeviceTaintEffect {
	f.t.Helper()
	r, err := f.client.ResourceV1().DeviceTaintRules().Get(context.Background(), vocabulary.OutageRuleName(n), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return r.Spec.Taint.Effect
}

func (f *fixture) hasLease() bool {
	_, err := f.client.CoordinationV1().Leases(ns).Get(context.Background(), vocabulary.HeartbeatLeaseName(node), metav1.GetOptions{})
	return err == nil
}

// step moves the controller's clock, maybe renews the Lease, syncs and
// says what must be there then.
type step struct {
	advance    time.Duration
	renew      bool
	wantEffect resourceapi.DeviceTaintEffect // "" none
	wantLease  bool
}

func TestSync(t *testing.T) {
	skewed := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC) // the node's clock is years behind
	for name, tc := range map[string]struct {
		opts  Options
		objs  []runtime.Object
		steps []step
	}{
		"renewed: never tainted": {
			objs: []runtime.Object{nodeObj(), sliceObj(), leaseObj(skewed)},
			steps: []step{
				{wantLease: true},
				{advance: 30 * time.Second, renew: true, wantLease: true},
				{advance: 30 * time.Second, renew: true, wantLease: true},
				{advance: 30 * time.Second, wantLease: true},
			},
		},
		"lapsed, then renewed": {
			objs: []runtime.Object{nodeObj(), sliceObj(), leaseObj(skewed)},
			steps: []step{
				{wantLease: true}, // first seen: a full grace period from now
				{advance: grace - time.Second, wantLease: true},
				{advance: 2 * time.Second, wantEffect: resourceapi.DeviceTaintEffectNoSchedule, wantLease: true},
				{advance: time.Hour, wantEffect: resourceapi.DeviceTaintEffectNoSchedule, wantLease: true},
				{renew: true, wantLease: true},
			},
		},
		"lapsed long: NoExecute": {
			opts: Options{NoExecuteAfter: 5 * time.Minute},
			objs: []runtime.Object{nodeObj(), sliceObj(), leaseObj(skewed)},
			steps: []step{
				{wantLease: true},
				{advance: grace + time.Second, wantEffect: resourceapi.DeviceTaintEffectNoSchedule, wantLease: true},
				{advance: 5 * time.Minute, wantEffect: resourceapi.DeviceTaintEffectNoExecute, wantLease: true},
				{renew: true, wantLease: true},
			},
		},
		"node deleted: rule and Lease cleaned up": {
			objs:  []runtime.Object{sliceObj(), leaseObj(skewed), ruleObj(resourceapi.DeviceTaintEffectNoSchedule)},
			steps: []step{{}},
		},
		"plugin removed from the node: no slices, rule and Lease cleaned up": {
			objs: []runtime.Object{nodeObj(), leaseObj(skewed)},
			steps: []step{
				{wantLease: true}, // within the grace period: the Lease stays
				{advance: grace + time.Second},
			},
		},
		"plugin removed, with a rule: cleaned up at once": {
			// The rule was made for the Lease's last renewal: lapsed already.
			objs:  []runtime.Object{nodeObj(), leaseObj(skewed), ruleObj(resourceapi.DeviceTaintEffectNoSchedule)},
			steps: []step{{}},
		},
		"plugin removed, another driver's slice in the pool: cleaned up": {
			objs: []runtime.Object{nodeObj(), otherDriverSlice(), leaseObj(skewed)},
			steps: []step{
				{wantLease: true},
				{advance: grace + time.Second},
			},
		},
		"no Lease: a leftover rule is deleted": {
			objs:  []runtime.Object{nodeObj(), sliceObj(), ruleObj(resourceapi.DeviceTaintEffectNoExecute)},
			steps: []step{{}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tc.opts, tc.objs...)
			for i, s := range tc.steps {
				f.clock.Step(s.advance)
				if s.renew {
					f.renew()
				}
				recheck := f.sync()
				if got := f.effect(); got != s.wantEffect {
					t.Errorf("step %d: rule effect %q, want %q", i, got, s.wantEffect)
				}
				if got := f.hasLease(); got != s.wantLease {
					t.Errorf("step %d: Lease there %v, want %v", i, got, s.wantLease)
				}
				if s.wantEffect == "" && s.wantLease && (recheck <= 0 || recheck > grace+recheckMargin) {
					t.Errorf("step %d: look again in %v, want within the grace period", i, recheck)
				}
				tainted := metricstest.Value(t, f.reg, "gpu_dra_controller_outage_tainted_nodes", nil)
				if want := map[bool]float64{true: 1}[s.wantEffect != ""]; tainted != want {
					t.Errorf("step %d: tainted nodes gauge %v, want %v", i, tainted, want)
				}
			}
		})
	}
}

// The rule a lapse creates says what an operator needs: which node, since
// when, which taint, and where to read on; it selects the node's pool of
// the driver's devices only.
func TestRuleContent(t *testing.T) {
	f := newFixture(t, Options{}, nodeObj(), sliceObj(), leaseObj(time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)))
	f.sync()
	f.clock.Step(grace + time.Second)
	f.sync()
	r, err := f.client.ResourceV1().DeviceTaintRules().Get(context.Background(), vocabulary.OutageRuleName(node), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel := r.Spec.DeviceSelector; sel == nil || ptr.Deref(sel.Driver, "") != vocabulary.DriverName || ptr.Deref(sel.Pool, "") != node || sel.Device != nil {
		t.Errorf("selector %+v, want driver %s, pool %s", sel, vocabulary.DriverName, node)
	}
	if tt := r.Spec.Taint; tt.Key != "gpu.dra.dev/outage" || tt.Value != "plugin-not-serving" {
		t.Errorf("taint %+v", tt)
	}
	select {
	case ev := <-f.events:
		if !strings.HasPrefix(ev, "Warning GPUPluginNotServing") || !strings.Contains(ev, "gpu.dra.dev/outage=plugin-not-serving:NoSchedule") {
			t.Errorf("node event %q", ev)
		}
	default:
		t.Error("no node event for the taint")
	}
	f.renew()
	f.sync()
	select {
	case ev := <-f.events:
		if !strings.HasPrefix(ev, "Normal GPUPluginServing") {
			t.Errorf("node event %q", ev)
		}
	default:
		t.Error("no node event for the untaint")
	}
	desc := r.Annotations[vocabulary.AnnotationDescription]
	for _, want := range []string{"node " + node, ns + "/" + vocabulary.HeartbeatLeaseName(node), "2026-01-02T03:00:00Z", "plugin-abc", "40s", "gpu.dra.dev/outage=plugin-not-serving:NoSchedule", "docs/operations.md"} {
		if !strings.Contains(desc, want) {
			t.Errorf("description lacks %q: %s", want, desc)
		}
	}
}

// Without DeviceTaintRules in discovery (Kubernetes 1.36 with default
// gates) Run taints nothing, reports it, keeps asking and does not fail;
// once they are served it starts.
func TestRunWithoutTheAPI(t *testing.T) {
	client := fake.NewClientset(nodeObj(), sliceObj(), leaseObj(time.Now()))
	served(client, false)
	reg := k8smetrics.NewKubeRegistry()
	m := metrics.New()
	m.MustRegister(reg)
	sliceFactory := driverSlices(client)
	c, err := New(client, sliceFactory.Resource().V1().ResourceSlices(), Options{DriverName: vocabulary.DriverName, Namespace: ns, GracePeriod: time.Second,
		MassLapseThreshold: DefaultMassLapseThreshold, MassLapseMinNodes: DefaultMassLapseMinNodes, DiscoveryInterval: 50 * time.Millisecond, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := Served(client); ok || err != nil {
		t.Fatalf("Served without the API: %v, %v", ok, err)
	}
	client.Discovery().(*fakediscovery.FakeDiscovery).Resources = nil // group version unknown: not an error
	if ok, err := Served(client); ok || err != nil {
		t.Fatalf("Served without the group version: %v, %v", ok, err)
	}
	served(client, false)
	ctx, cancel := context.WithCancel(context.Background())
	sliceFactory.Start(ctx.Done()) // as pkg/controller starts it: before Run
	defer sliceFactory.Shutdown()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, 1) }()
	time.Sleep(3 * time.Second) // the Lease lapses: nothing may happen
	if v := metricstest.Value(t, reg, "gpu_dra_controller_outage_taints_available", nil); v != 0 {
		t.Errorf("taints available = %v without the API", v)
	}
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "devicetaintrules" || a.GetResource().Resource == "leases" {
			t.Errorf("without the API the controller touched %s: %s", a.GetResource().Resource, a.GetVerb())
		}
	}
	served(client, true)
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.ResourceV1().DeviceTaintRules().Get(ctx, vocabulary.OutageRuleName(node), metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Errorf("once the API is served, the lapsed Lease did not taint the node: %v", err)
	}
	if v := metricstest.Value(t, reg, "gpu_dra_controller_outage_taints_available", nil); v != 1 {
		t.Errorf("taints available = %v with the API", v)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("Run did not return after cancel")
	}
}

func TestNewRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		opts Options
		want string
	}{
		"no namespace":             {Options{DriverName: "d", GracePeriod: grace}, "namespace"},
		"no grace":                 {Options{DriverName: "d", Namespace: ns}, "grace period"},
		"NoExecute before NoSched": {Options{DriverName: "d", Namespace: ns, GracePeriod: grace, NoExecuteAfter: time.Second}, "at least the grace period"},
		"no mass lapse threshold":  {Options{DriverName: "d", Namespace: ns, GracePeriod: grace, MassLapseMinNodes: 3}, "mass lapse threshold 0 must be a share in (0, 1]"},
		"mass lapse threshold > 1": {Options{DriverName: "d", Namespace: ns, GracePeriod: grace, MassLapseThreshold: 1.1, MassLapseMinNodes: 3}, "mass lapse threshold 1.1"},
		"no mass lapse minimum":    {Options{DriverName: "d", Namespace: ns, GracePeriod: grace, MassLapseThreshold: 0.5}, "mass lapse minimum of nodes 0"},
	} {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset()
			if _, err := New(client, driverSlices(client).Resource().V1().ResourceSlices(), tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
