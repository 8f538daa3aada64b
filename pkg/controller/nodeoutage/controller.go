package nodeoutage

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	resourceinformers "k8s.io/client-go/informers/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubeclient"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Defaults of Options.
const (
	// DefaultGracePeriod is four heartbeat periods (pkg/heartbeat), as the
	// node lifecycle controller waits for node Leases: a renewal or two
	// lost to a busy API server does not taint a node.
	DefaultGracePeriod = 40 * time.Second
	// DefaultDiscoveryInterval is how often the controller asks again
	// whether the API server serves DeviceTaintRules.
	DefaultDiscoveryInterval = time.Minute
	// DefaultMassLapseThreshold and DefaultMassLapseMinNodes are the node
	// lifecycle controller's unhealthy zone defaults
	// (--unhealthy-zone-threshold 0.55, more than two nodes).
	DefaultMassLapseThreshold = 0.55
	DefaultMassLapseMinNodes  = 3
)

// Options configure the Controller.
type Options struct {
	DriverName string
	// Namespace holds the heartbeat Leases: the release namespace.
	Namespace string
	// GracePeriod is how long a Lease may go unrenewed before the node's
	// devices are tainted NoSchedule.
	GracePeriod time.Duration
	// NoExecuteAfter, when positive, turns the taint into NoExecute once
	// the Lease has gone unrenewed that long (at least GracePeriod): the
	// pods using the node's devices are evicted. 0: never.
	NoExecuteAfter time.Duration
	// MassLapseThreshold (0 < t <= 1) and MassLapseMinNodes (>= 1): when at
	// least that share of the nodes with a heartbeat Lease, and at least
	// that many, are lapsed at once, the cause is more likely the API server
	// or this controller than every plugin: escalation stops (no NoExecute,
	// existing NoExecute rules go back to NoSchedule) until fewer are.
	MassLapseThreshold float64
	MassLapseMinNodes  int
	// MassLapseTaint: during a mass lapse, newly lapsed nodes are still
	// tainted NoSchedule; false: they are not tainted at all.
	MassLapseTaint bool
	// DiscoveryInterval: see DefaultDiscoveryInterval.
	DiscoveryInterval time.Duration
	Clock             clock.PassiveClock
	Metrics           *metrics.Metrics
	// Recorder records the Node events of a taint and its removal; nil:
	// Run records them through the API (events.k8s.io).
	Recorder events.EventRecorder
}

// Controller keeps one DeviceTaintRule per node whose heartbeat lapsed.
type Controller struct {
	client  kubernetes.Interface
	opts    Options
	metrics *metrics.Metrics
	queue   workqueue.TypedRateLimitingInterface[string]
	// sliceInformer is the controller's shared one (pkg/controller):
	// the slices are cached once in the process.
	sliceInformer cache.SharedIndexInformer

	leases, nodes, slices, rules cache.Indexer

	mu sync.Mutex
	// seen is, per node, the renewTime last seen in its Lease and when
	// (controller clock) it was first seen.
	seen map[string]observation
	// tainted is the set of nodes with a rule, for the gauge.
	tainted map[string]bool
	// massLapse is the last judgement of judgeMassLapse; heldBack are the
	// nodes whose taint it holds back (one event each).
	massLapse bool
	heldBack  map[string]bool
}

// observation is a renewal of a node's Lease and when (controller clock)
// it was first seen, or since when it counts as lapsed.
type observation struct {
	renewal renewal
	at      time.Time
}

// renewal identifies one renewal of a heartbeat Lease.
type renewal struct{ renewTime, holder string }

// eventSource is the reporting controller of the Node events.
const eventSource = "gpu-dra-controller"

// poolIndex indexes the driver's slices by pool name: the node name
// (pkg/devicemodel).
const poolIndex = "gpu-dra-controller-outage-pool"

// New checks opts and indexes the slices; nothing runs before Run. The
// slice informer may be shared (and filtered to the driver); it must not
// have been started, and whoever owns it starts it.
func New(client kubernetes.Interface, sliceInformer resourceinformers.ResourceSliceInformer, opts Options) (*Controller, error) {
	switch {
	case opts.DriverName == "":
		return nil, errors.New("node outage: no driver name")
	case opts.Namespace == "":
		return nil, errors.New("node outage: no namespace for the heartbeat Leases (--namespace)")
	case opts.GracePeriod <= 0:
		return nil, fmt.Errorf("node outage: grace period %s must be positive", opts.GracePeriod)
	case opts.NoExecuteAfter < 0 || opts.NoExecuteAfter > 0 && opts.NoExecuteAfter < opts.GracePeriod:
		return nil, fmt.Errorf("node outage: NoExecute after %s must be 0 (never) or at least the grace period %s", opts.NoExecuteAfter, opts.GracePeriod)
	case !(opts.MassLapseThreshold > 0 && opts.MassLapseThreshold <= 1):
		return nil, fmt.Errorf("node outage: mass lapse threshold %v must be a share in (0, 1]", opts.MassLapseThreshold)
	case opts.MassLapseMinNodes < 1:
		return nil, fmt.Errorf("node outage: mass lapse minimum of nodes %d must be at least 1", opts.MassLapseMinNodes)
	}
	if opts.DiscoveryInterval <= 0 {
		opts.DiscoveryInterval = DefaultDiscoveryInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	c := &Controller{
		client: client, opts: opts, metrics: metrics.OrNew(opts.Metrics),
		seen: map[string]observation{}, tainted: map[string]bool{}, heldBack: map[string]bool{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu_dra_node_outage"}),
		sliceInformer: sliceInformer.Informer(),
	}
	c.slices = c.sliceInformer.GetIndexer()
	if _, exists := c.slices.GetIndexers()[poolIndex]; !exists {
		if err := c.sliceInformer.AddIndexers(cache.Indexers{poolIndex: func(obj any) ([]string, error) {
			if pool := c.slicePool(obj); pool != "" {
				return []string{pool}, nil
			}
			return nil, nil
		}}); err != nil {
			return nil, fmt.Errorf("node outage: index ResourceSlices by pool: %w", err)
		}
	}
	return c, nil
}

// Run waits until the API server serves DeviceTaintRules, then reconciles
// until ctx is done. Without the API it never fails: outage taints are
// just unavailable, which it logs and reports.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)
	if !c.waitForAPI(ctx) {
		return nil
	}
	factories, synced, err := c.informers()
	if err != nil {
		return err
	}
	if c.opts.Recorder == nil {
		b := events.NewEventBroadcasterAdapterWithContext(ctx, c.client)
		b.StartRecordingToSink(ctx.Done())
		defer b.Shutdown()
		c.opts.Recorder = b.NewRecorder(eventSource)
	}
	for _, f := range factories {
		f.Start(ctx.Done())
		defer f.Shutdown()
	}
	if !cache.WaitForNamedCacheSyncWithContext(ctx, synced...) {
		return fmt.Errorf("node outage: caches not synced: %w", context.Cause(ctx))
	}
	logger.Info("Tainting the devices of nodes whose plugin does not serve", "driver", c.opts.DriverName,
		"leaseNamespace", c.opts.Namespace, "gracePeriod", c.opts.GracePeriod, "noExecuteAfter", c.opts.NoExecuteAfter,
		"massLapseThreshold", c.opts.MassLapseThreshold, "massLapseMinNodes", c.opts.MassLapseMinNodes, "massLapseTaint", c.opts.MassLapseTaint)
	for _, node := range c.prime() {
		c.queue.Add(node)
	}
	for range max(workers, 1) {
		go wait.UntilWithContext(ctx, func(ctx context.Context) {
			for c.processNext(ctx) {
			}
		}, time.Second)
	}
	<-ctx.Done()
	return nil
}

// waitForAPI returns true once discovery lists DeviceTaintRules in
// resource.k8s.io/v1, false when ctx ends first.
func (c *Controller) waitForAPI(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	reported := false
	for {
		ok, err := Served(c.client)
		switch {
		case ok:
			c.metrics.OutageTaintsAvailable.Set(1)
			if reported {
				logger.Info("DeviceTaintRules are served now: outage taints are available")
			}
			return true
		case err != nil:
			logger.Error(err, "Cannot tell whether DeviceTaintRules are served; asking again", "in", c.opts.DiscoveryInterval)
		case !reported:
			c.metrics.OutageTaintsAvailable.Set(0)
			logger.Error(nil, "Outage taints are unavailable: the API server does not serve resource.k8s.io/v1 DeviceTaintRules "+
				"(Kubernetes 1.37+, feature gate DRADeviceTaintRules). Nodes whose kubelet plugin stops serving keep attracting GPU pods; "+
				"the controller checks again periodically", "every", c.opts.DiscoveryInterval)
			reported = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(c.opts.DiscoveryInterval):
		}
	}
}

// Served reports whether the API server serves resource.k8s.io/v1
// DeviceTaintRules; a group version it does not know is false, not an error.
func Served(client kubernetes.Interface) (bool, error) {
	return kubeclient.Serves(client.Discovery(), resourceapi.SchemeGroupVersion.String(), "devicetaintrules")
}

// informers watches the heartbeat Leases, the nodes (names only) and the
// managed rules, and handles the driver's slices from the shared informer;
// every change queues its node. Only the returned factories are its own to
// start.
func (c *Controller) informers() ([]informers.SharedInformerFactory, []cache.InformerSynced, error) {
	byLabel := func(label string) informers.SharedInformerOption {
		return informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = label + "=true" })
	}
	leaseFactory := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithNamespace(c.opts.Namespace), byLabel(vocabulary.LabelHeartbeat))
	ruleFactory := informers.NewSharedInformerFactoryWithOptions(c.client, 0, byLabel(vocabulary.LabelOutage))
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithTransform(nodeName))
	leases := leaseFactory.Coordination().V1().Leases().Informer()
	rules := ruleFactory.Resource().V1().DeviceTaintRules().Informer()
	nodes := nodeFactory.Core().V1().Nodes().Informer()
	var synced []cache.InformerSynced
	for inf, key := range map[cache.SharedIndexInformer]func(any) string{
		leases: leaseNode, rules: ruleNode, nodes: objectName, c.sliceInformer: c.slicePool,
	} {
		reg, err := inf.AddEventHandler(c.enqueue(key))
		if err != nil {
			return nil, nil, err
		}
		synced = append(synced, reg.HasSynced)
	}
	c.leases, c.rules, c.nodes = leases.GetIndexer(), rules.GetIndexer(), nodes.GetIndexer()
	return []informers.SharedInformerFactory{leaseFactory, ruleFactory, nodeFactory}, synced, nil
}

func (c *Controller) enqueue(key func(any) string) cache.ResourceEventHandler {
	add := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if node := key(obj); node != "" {
			c.queue.Add(node)
		}
	}
	return cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, obj any) { add(obj) }, DeleteFunc: add}
}

// Node names from the objects: "" for objects that are not ours.
func leaseNode(obj any) string {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok || !strings.HasPrefix(l.Name, vocabulary.HeartbeatLeasePrefix) {
		return ""
	}
	return strings.TrimPrefix(l.Name, vocabulary.HeartbeatLeasePrefix)
}

func ruleNode(obj any) string {
	r, ok := obj.(*resourceapi.DeviceTaintRule)
	if !ok || !strings.HasPrefix(r.Name, vocabulary.OutageRulePrefix) {
		return ""
	}
	return strings.TrimPrefix(r.Name, vocabulary.OutageRulePrefix)
}

func objectName(obj any) string {
	if m, ok := obj.(metav1.Object); ok {
		return m.GetName()
	}
	return ""
}

// slicePool is "" for another driver's slice too: a shared informer need
// not be filtered to the driver.
func (c *Controller) slicePool(obj any) string {
	if s, ok := obj.(*resourceapi.ResourceSlice); ok && s.Spec.Driver == c.opts.DriverName {
		return s.Spec.Pool.Name
	}
	return ""
}

// nodeName keeps only a node's name: the controller needs to know which
// nodes exist, nothing else.
func nodeName(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion}}, nil
	}
	return obj, nil
}

// prime observes every Lease before the first Sync, so that the share of
// lapsed nodes is judged over all of them from the start (a restart must
// not see a mass lapse in the first few nodes it syncs). It returns the
// nodes with a Lease or a rule.
func (c *Controller) prime() []string {
	now := c.opts.Clock.Now()
	for _, obj := range c.leases.List() {
		if n := leaseNode(obj); n != "" {
			c.observe(n, obj.(*coordinationv1.Lease), get[resourceapi.DeviceTaintRule](c.rules, vocabulary.OutageRuleName(n)), now)
		}
	}
	return c.knownNodes()
}

// knownNodes are the nodes with a Lease or a rule.
func (c *Controller) knownNodes() []string {
	var out []string
	for _, obj := range c.leases.List() {
		if n := leaseNode(obj); n != "" {
			out = append(out, n)
		}
	}
	for _, obj := range c.rules.List() {
		if n := ruleNode(obj); n != "" {
			out = append(out, n)
		}
	}
	return out
}

func (c *Controller) processNext(ctx context.Context) bool {
	node, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(node)
	recheck, err := c.Sync(ctx, node)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reconciling the node's outage taint failed, will retry", "node", node)
		c.queue.AddRateLimited(node)
		return true
	}
	c.queue.Forget(node)
	if recheck > 0 {
		c.queue.AddAfter(node, recheck)
	}
	return true
}

// get returns the object at key in the indexer, nil when there is none.
func get[T any](idx cache.Indexer, key string) *T {
	obj, ok, err := idx.GetByKey(key)
	if err != nil || !ok {
		return nil
	}
	t, _ := obj.(*T)
	return t
}
