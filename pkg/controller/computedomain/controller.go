package computedomain

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	resourceinformers "k8s.io/client-go/informers/resource/v1"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// DefaultPruneGracePeriod is how long a node entry may stand without a pod
// of the domain on its node before the controller removes it: a node that
// died cannot remove its own entry.
const DefaultPruneGracePeriod = 5 * time.Minute

// NodeFieldManager is the field manager of a node's entry in status.nodes
// (its kubelet plugin applies it); the controller prunes an entry by
// applying an empty list as that manager.
func NodeFieldManager(node string) string { return "gpu.dra.dev/node-" + node }

// Options configure the Controller.
type Options struct {
	// DriverName is the driver of the channel claims (gpu.dra.dev).
	DriverName string
	// Channels is the number of channel devices per clique
	// (imexchannels.Options.Channels): channel numbers 0..Channels-1 are
	// reserved for domains, one each.
	Channels int
	// PruneGracePeriod: see DefaultPruneGracePeriod.
	PruneGracePeriod time.Duration
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
}

// Controller reconciles ComputeDomains.
type Controller struct {
	client  kubernetes.Interface
	domains dynamic.NamespaceableResourceInterface
	opts    Options

	lister cache.GenericLister
	claims resourcelisters.ResourceClaimLister
	synced []cache.InformerSynced
	queue  workqueue.TypedRateLimitingInterface[string]

	// reserveMu serialises channel reservations (reserveChannel).
	reserveMu sync.Mutex

	mu sync.Mutex
	// noPodsSince is when the controller first saw a node entry
	// (domain key + "/" + node) without a pod of the domain on its node.
	noPodsSince map[string]time.Time
	// lastPodGone is when this controller first saw an AfterLastPod
	// domain (by key) without pods: the earliest start of its grace
	// period it trusts (lifetime.go).
	lastPodGone map[string]sighting
}

// New creates the controller and registers its event handlers on the
// ComputeDomain informer (dynamic, over gpuv1beta1.ComputeDomainResource)
// and the ResourceClaim informer.
func New(client kubernetes.Interface, dyn dynamic.Interface, domainInformer informers.GenericInformer, claimInformer resourceinformers.ResourceClaimInformer, opts Options) (*Controller, error) {
	if opts.DriverName == "" {
		return nil, fmt.Errorf("compute domains: no driver name")
	}
	if opts.Channels <= 0 {
		return nil, fmt.Errorf("compute domains: no channel count")
	}
	if opts.PruneGracePeriod <= 0 {
		opts.PruneGracePeriod = DefaultPruneGracePeriod
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &Controller{
		client: client, domains: dyn.Resource(gpuv1beta1.ComputeDomainResource), opts: opts,
		lister: domainInformer.Lister(), claims: claimInformer.Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu_dra_compute_domains"}),
		noPodsSince: map[string]time.Time{},
		lastPodGone: map[string]sighting{},
	}
	domainReg, err := domainInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueDomain,
		UpdateFunc: func(_, cur any) { c.enqueueDomain(cur) },
		DeleteFunc: c.enqueueDomain,
	})
	if err != nil {
		return nil, err
	}
	claimReg, err := claimInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueueClaim,
		UpdateFunc: func(_, cur any) { c.enqueueClaim(cur) },
		DeleteFunc: c.enqueueClaim,
	})
	if err != nil {
		return nil, err
	}
	c.synced = []cache.InformerSynced{domainReg.HasSynced, claimReg.HasSynced}
	return c, nil
}

func (c *Controller) enqueueDomain(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		c.queue.Add(key)
	}
}

// enqueueClaim enqueues the domains of the claim's namespace that name it
// (its owner and any domain whose claim name a foreign claim took) and the
// domain its channel config names (a pod's claim in template mode).
func (c *Controller) enqueueClaim(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	claim, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return
	}
	objs, err := c.lister.ByNamespace(claim.Namespace).List(everything)
	if err != nil {
		return
	}
	named := channelDomain(claim, c.opts.DriverName) // a template-mode domain's pod's claim
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		if name, _, _ := unstructured.NestedString(u.Object, "spec", "channel", "resourceClaimName"); name == claim.Name || u.GetName() == named {
			c.queue.Add(claim.Namespace + "/" + u.GetName())
		}
	}
}

// Run reconciles until ctx is done.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx).WithName("compute-domains")
	ctx = klog.NewContext(ctx, logger)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced...) {
		return nil
	}
	logger.Info("Reconciling ComputeDomains", "workers", workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for c.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	after, err := c.Sync(ctx, key)
	switch {
	case err != nil:
		klog.FromContext(ctx).Error(err, "Reconcile ComputeDomain", "domain", key)
		c.queue.AddRateLimited(key)
	case after > 0:
		c.queue.Forget(key)
		c.queue.AddAfter(key, after)
	default:
		c.queue.Forget(key)
	}
	return true
}

// Sync reconciles one domain (namespace/name). It returns when to look
// again (0: on the next event).
func (c *Controller) Sync(ctx context.Context, key string) (time.Duration, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil
	}
	obj, err := c.lister.ByNamespace(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.forget(key, nil)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return 0, fmt.Errorf("ComputeDomain %s: unexpected %T", key, obj)
	}
	cd := &gpuv1beta1.ComputeDomain{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cd); err != nil {
		return 0, c.setConditions(ctx, cd, u, notReady(ReasonInvalid, fmt.Sprintf("cannot read the object: %v", err)))
	}
	if cd.DeletionTimestamp != nil {
		return 0, nil
	}
	cd.Default()
	if errs := cd.Validate(); len(errs) > 0 {
		return 0, c.setConditions(ctx, cd, u, notReady(ReasonInvalid, errs.ToAggregate().Error()))
	}

	claims, err := c.channelClaims(ctx, cd, u)
	if err != nil || claims == nil {
		return noChannelRecheck, err
	}
	cached := claims.cached()
	pods := podsOf(cached...)
	podNodes, err := c.podNodes(ctx, ns, pods)
	if err != nil {
		return 0, err
	}
	nodes, after, err := c.prune(ctx, key, cd, claims, podNodes)
	if err != nil {
		return 0, err
	}
	pods0 := meta.FindStatusCondition(cd.Status.Conditions, ConditionPodsScheduled)
	podsCond := podsCondition(pods0, len(pods))
	if err := c.setConditions(ctx, cd, u, readyCondition(nodes), podsCond); err != nil {
		return 0, err
	}

	if cd.Spec.Lifetime.Policy != gpuv1beta1.LifetimeAfterLastPod || podsCond.Reason != ReasonNoPods {
		c.clearLastPodGone(key)
		return after, nil
	}
	wait, err := c.afterLastPod(ctx, key, cd, claims)
	return minPositive(after, wait), err
}

// channelClaims reserves the domain's channel number, creates its shared
// claim or its claim template, and returns its claims; nil, nil when it
// set Ready False instead (no free number, a name taken).
func (c *Controller) channelClaims(ctx context.Context, cd *gpuv1beta1.ComputeDomain, u *unstructured.Unstructured) (domainClaims, error) {
	ns := cd.Namespace
	if cd.Spec.Channel.ResourceClaimTemplateName != "" {
		return c.syncTemplate(ctx, cd, u)
	}
	cached, err := c.claims.ResourceClaims(ns).Get(cd.Spec.Channel.ResourceClaimName)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, err
	}
	if err == nil && !metav1.IsControlledBy(cached, cd) {
		return nil, c.claimConflict(ctx, cd, u, "ResourceClaim", cached.Name)
	}
	channel, err := c.reserveChannel(ctx, cd, u, cached)
	if err != nil || channel == nil {
		return nil, err
	}
	claim, err := c.channelClaim(ctx, cd, *channel)
	if err != nil {
		return nil, err
	}
	if !metav1.IsControlledBy(claim, cd) {
		return nil, c.claimConflict(ctx, cd, u, "ResourceClaim", claim.Name)
	}
	return sharedClaim{c: c, cd: cd, claim: claim}, nil
}

// syncTemplate reserves a template-mode domain's channel number and
// creates its claim template; its claims are its pods' own.
func (c *Controller) syncTemplate(ctx context.Context, cd *gpuv1beta1.ComputeDomain, u *unstructured.Unstructured) (domainClaims, error) {
	channel, err := c.reserveChannel(ctx, cd, u, nil)
	if err != nil || channel == nil {
		return nil, err
	}
	tmpl, err := c.channelTemplate(ctx, cd, *channel)
	if err != nil {
		return nil, err
	}
	if !metav1.IsControlledBy(tmpl, cd) {
		return nil, c.claimConflict(ctx, cd, u, "ResourceClaimTemplate", tmpl.Name)
	}
	return templateClaims{c: c, cd: cd}, nil
}

// claimConflict sets Ready False: an object of the domain's claim or
// template name exists and is not the domain's.
func (c *Controller) claimConflict(ctx context.Context, cd *gpuv1beta1.ComputeDomain, u *unstructured.Unstructured, kind, name string) error {
	return c.setConditions(ctx, cd, u, notReady(ReasonClaimConflict, fmt.Sprintf(
		"%s %s/%s exists and is not this ComputeDomain's: the controller leaves it alone; delete it or name another in a new ComputeDomain",
		kind, cd.Namespace, name)))
}

// channelClaim returns the domain's claim, creating it for the domain's
// channel number when missing.
func (c *Controller) channelClaim(ctx context.Context, cd *gpuv1beta1.ComputeDomain, channel int32) (*resourceapi.ResourceClaim, error) {
	name := cd.Spec.Channel.ResourceClaimName
	claim, err := c.claims.ResourceClaims(cd.Namespace).Get(name)
	if err == nil {
		return claim, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	claim, err = c.client.ResourceV1().ResourceClaims(cd.Namespace).Create(ctx, ChannelClaim(cd, c.opts.DriverName, channel), metav1.CreateOptions{FieldManager: FieldManager})
	if apierrors.IsAlreadyExists(err) { // not in the cache yet: read it
		claim, err = c.client.ResourceV1().ResourceClaims(cd.Namespace).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("create channel claim %s/%s: %w", cd.Namespace, name, err)
	}
	klog.FromContext(ctx).V(2).Info("Created channel claim", "domain", klog.KObj(cd), "claim", klog.KObj(claim))
	return claim, nil
}

// podNodes are the nodes of the pods reserving the claim; a pod that is
// gone or replaced (another UID) counts for none.
func (c *Controller) podNodes(ctx context.Context, ns string, pods []resourceapi.ResourceClaimConsumerReference) (sets.Set[string], error) {
	out := sets.New[string]()
	for _, r := range pods {
		pod, err := c.client.CoreV1().Pods(ns).Get(ctx, r.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s of the channel claim: %w", ns, r.Name, err)
		}
		if pod.UID == r.UID && pod.Spec.NodeName != "" {
			out.Insert(pod.Spec.NodeName)
		}
	}
	return out, nil
}

// setConditions applies the controller's conditions, keeping the
// transition time of those whose status did not change, and writes only
// when something changed. It updates cd's conditions.
func (c *Controller) setConditions(ctx context.Context, cd *gpuv1beta1.ComputeDomain, u *unstructured.Unstructured, conds ...metav1.Condition) error {
	now := metav1.NewTime(c.opts.Now().Truncate(time.Second))
	next := slices.Clone(cd.Status.Conditions)
	changed := false
	for _, cond := range conds {
		cond.ObservedGeneration = cd.Generation
		cond.LastTransitionTime = now
		changed = meta.SetStatusCondition(&next, cond) || changed
	}
	cd.Status.Conditions = next
	if !changed {
		return nil
	}
	var owned []any
	for _, cond := range next {
		if cond.Type != ConditionReady && cond.Type != ConditionPodsScheduled {
			continue
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&cond)
		if err != nil {
			return err
		}
		owned = append(owned, m)
	}
	patch := applyObject(cd)
	if cd.Name == "" { // unreadable: address it by the informer's object
		patch.SetName(u.GetName())
		patch.SetNamespace(u.GetNamespace())
	}
	patch.Object["status"] = map[string]any{"conditions": owned}
	_, err := c.domains.Namespace(patch.GetNamespace()).ApplyStatus(ctx, patch.GetName(), patch, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("update conditions of ComputeDomain %s/%s: %w", patch.GetNamespace(), patch.GetName(), err)
	}
	return nil
}

func applyObject(cd *gpuv1beta1.ComputeDomain) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetAPIVersion(gpuv1beta1.GroupVersion.String())
	u.SetKind(gpuv1beta1.ComputeDomainKind)
	u.SetName(cd.Name)
	u.SetNamespace(cd.Namespace)
	return u
}

// forget drops the pruning clock of one node of the domain, or all the
// domain's clocks.
func (c *Controller) forget(key string, node *string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if node != nil {
		delete(c.noPodsSince, key+"/"+*node)
		return
	}
	delete(c.lastPodGone, key)
	for k := range c.noPodsSince {
		if _, ok := cutKey(k, key); ok {
			delete(c.noPodsSince, k)
		}
	}
}

func cutKey(k, domainKey string) (string, bool) {
	if len(k) > len(domainKey)+1 && k[:len(domainKey)] == domainKey && k[len(domainKey)] == '/' {
		return k[len(domainKey)+1:], true
	}
	return "", false
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 {
		return b
	}
	if b <= 0 {
		return a
	}
	return min(a, b)
}
