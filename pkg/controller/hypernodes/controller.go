package hypernodes

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	coreinformers "k8s.io/client-go/informers/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// DefaultResync is how often the controller checks that the HyperNode API
// is served (Volcano installed after the controller started) and repairs
// HyperNodes changed or deleted by others.
const DefaultResync = time.Minute

// syncKey is the queue's only key: every sync reconciles all cliques.
const syncKey = "hypernodes"

// Options configure the Controller.
type Options struct {
	// Resync is the period of the full sync; 0: DefaultResync.
	Resync time.Duration
}

// Controller keeps one HyperNode per clique, creating, updating and
// deleting only the HyperNodes it manages (managedSelector).
type Controller struct {
	discovery discovery.DiscoveryInterface
	client    dynamic.NamespaceableResourceInterface
	nodes     corelisters.NodeLister
	synced    cache.InformerSynced
	resync    time.Duration
	queue     workqueue.TypedRateLimitingInterface[string]
	// served is the last answer of discovery (nil: none yet), to log it
	// once and then its changes.
	served *bool
}

// New creates the controller and registers its node event handler; the
// node informer may be shared and must keep the nodes' labels.
func New(disc discovery.DiscoveryInterface, dyn dynamic.Interface, nodeInformer coreinformers.NodeInformer, opts Options) (*Controller, error) {
	c := &Controller{
		discovery: disc,
		client:    dyn.Resource(Resource),
		nodes:     nodeInformer.Lister(),
		resync:    opts.Resync,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu_dra_hypernodes"}),
	}
	if c.resync <= 0 {
		c.resync = DefaultResync
	}
	enqueue := func(any) { c.queue.Add(syncKey) }
	reg, err := nodeInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			if ok1 && ok2 && o.Labels[vocabulary.LabelClique] == n.Labels[vocabulary.LabelClique] {
				return
			}
			c.queue.Add(syncKey)
		},
		DeleteFunc: enqueue,
	})
	if err != nil {
		return nil, fmt.Errorf("hypernodes: %w", err)
	}
	c.synced = reg.HasSynced
	return c, nil
}

// Run waits for the node cache and syncs on node changes and every resync
// period until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced) {
		return fmt.Errorf("hypernodes: caches not synced: %w", context.Cause(ctx))
	}
	logger.Info("Keeping a Volcano HyperNode per NVLink clique", "tier", Tier, "resync", c.resync)
	go wait.UntilWithContext(ctx, func(context.Context) { c.queue.Add(syncKey) }, c.resync)
	go wait.UntilWithContext(ctx, c.worker, time.Second)
	<-ctx.Done()
	return nil
}

func (c *Controller) worker(ctx context.Context) {
	for {
		key, quit := c.queue.Get()
		if quit {
			return
		}
		if err := c.Sync(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Syncing HyperNodes failed, will retry")
			c.queue.AddRateLimited(key)
		} else {
			c.queue.Forget(key)
		}
		c.queue.Done(key)
	}
}

// Served reports whether the API server serves HyperNodes (Volcano's CRD
// is installed).
func (c *Controller) Served() (bool, error) {
	list, err := c.discovery.ServerResourcesForGroupVersion(Resource.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover %s: %w", Resource.GroupVersion(), err)
	}
	for _, r := range list.APIResources {
		if r.Name == Resource.Resource {
			return true, nil
		}
	}
	return false, nil
}

// Sync makes the managed HyperNodes those of the current cliques; without
// the HyperNode API it does nothing. A HyperNode of a clique's name that the
// controller does not manage is left alone, and reported in the error.
func (c *Controller) Sync(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	served, err := c.Served()
	if err != nil {
		return err
	}
	if c.served == nil || *c.served != served {
		logger.Info("HyperNode API (Volcano's CRD)", "resource", Resource, "served", served)
		c.served = &served
	}
	if !served {
		return nil
	}
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil {
		return err
	}
	want := cliques(nodes)
	list, err := c.client.List(ctx, metav1.ListOptions{LabelSelector: managedSelector})
	if err != nil {
		return fmt.Errorf("list HyperNodes: %w", err)
	}
	have := map[string]*unstructured.Unstructured{}
	var errs []error
	for i := range list.Items {
		hn := &list.Items[i]
		clique := hn.GetLabels()[vocabulary.LabelClique]
		if _, ok := want[clique]; ok && hn.GetName() == Name(clique) {
			have[clique] = hn
			continue
		}
		// A managed HyperNode of a clique that has no nodes left (or
		// one renamed by hand): delete it, if unchanged since listed.
		uid, rv := hn.GetUID(), hn.GetResourceVersion()
		err := c.client.Delete(ctx, hn.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete HyperNode %s: %w", hn.GetName(), err))
			continue
		}
		logger.Info("Deleted HyperNode", "hyperNode", hn.GetName(), "clique", clique)
	}
	for clique, members := range want {
		if err := c.syncClique(ctx, clique, members, have[clique]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// syncClique creates or updates the HyperNode of one clique; have is the
// managed one, nil if none was listed.
func (c *Controller) syncClique(ctx context.Context, clique string, members []string, have *unstructured.Unstructured) error {
	logger := klog.FromContext(ctx)
	want := desired(clique, members)
	name := want.GetName()
	if have == nil {
		_, err := c.client.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("HyperNode %s of clique %s exists and is not managed by the driver (no labels %s): left alone", name, clique, managedSelector)
		}
		if err != nil {
			return fmt.Errorf("create HyperNode %s: %w", name, err)
		}
		logger.Info("Created HyperNode", "hyperNode", name, "clique", clique, "nodes", members)
		return nil
	}
	if upToDate(have, want) {
		return nil
	}
	updated := have.DeepCopy()
	l := updated.GetLabels()
	for k, v := range want.GetLabels() {
		l[k] = v
	}
	updated.SetLabels(l)
	updated.Object["spec"] = want.Object["spec"]
	if _, err := c.client.Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update HyperNode %s: %w", name, err)
	}
	logger.Info("Updated HyperNode", "hyperNode", name, "clique", clique, "nodes", members)
	return nil
}
