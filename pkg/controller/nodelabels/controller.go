package nodelabels

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	resourceinformers "k8s.io/client-go/informers/resource/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
)

// nodeNameIndex indexes ResourceSlices by spec.nodeName.
const nodeNameIndex = "gpu-dra-controller-nodeName"

// Options configure the Controller.
type Options struct {
	// DriverName is the driver whose slices are read (gpu.dra.dev).
	DriverName string
	// Metrics may be nil.
	Metrics *metrics.Metrics
}

// Controller keeps the labels of every node in line with the node's
// ResourceSlices. It writes only labels it owns (listed in
// OwnedAnnotation) and never overwrites a label someone else set.
type Controller struct {
	client  kubernetes.Interface
	driver  string
	metrics *metrics.Metrics

	nodes       corelisters.NodeLister
	slices      cache.Indexer
	cacheSynced []cache.InformerSynced
	queue       workqueue.TypedRateLimitingInterface[string]
}

// New creates the controller and registers its event handlers. The
// informers may be shared; the slice informer may be filtered to the
// driver, and must not have been started (an index is added).
func New(client kubernetes.Interface, sliceInformer resourceinformers.ResourceSliceInformer, nodeInformer coreinformers.NodeInformer, opts Options) (*Controller, error) {
	if opts.DriverName == "" {
		return nil, fmt.Errorf("node labels: no driver name")
	}
	c := &Controller{
		client:  client,
		driver:  opts.DriverName,
		metrics: metrics.OrNew(opts.Metrics),
		nodes:   nodeInformer.Lister(),
		slices:  sliceInformer.Informer().GetIndexer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu_dra_node_labels"}),
	}
	if _, exists := c.slices.GetIndexers()[nodeNameIndex]; !exists {
		if err := sliceInformer.Informer().AddIndexers(cache.Indexers{nodeNameIndex: sliceNodeName}); err != nil {
			return nil, fmt.Errorf("index ResourceSlices by node: %w", err)
		}
	}
	sliceReg, err := sliceInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueueSlice,
		UpdateFunc: func(old, cur any) {
			c.enqueueSlice(old)
			c.enqueueSlice(cur)
		},
		DeleteFunc: c.enqueueSlice,
	})
	if err != nil {
		return nil, err
	}
	nodeReg, err := nodeInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.enqueueNode,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			// Only what the controller reads matters: status heartbeats do not.
			if ok1 && ok2 && maps.Equal(o.Labels, n.Labels) && maps.Equal(o.Annotations, n.Annotations) {
				return
			}
			c.enqueueNode(cur)
		},
	})
	if err != nil {
		return nil, err
	}
	c.cacheSynced = []cache.InformerSynced{sliceReg.HasSynced, nodeReg.HasSynced}
	return c, nil
}

func sliceNodeName(obj any) ([]string, error) {
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok || s.Spec.NodeName == nil || *s.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{*s.Spec.NodeName}, nil
}

func (c *Controller) enqueueSlice(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok || s.Spec.Driver != c.driver || s.Spec.NodeName == nil || *s.Spec.NodeName == "" {
		return
	}
	c.queue.Add(*s.Spec.NodeName)
}

func (c *Controller) enqueueNode(obj any) {
	if n, ok := obj.(*corev1.Node); ok {
		c.queue.Add(n.Name)
	}
}

// StripNode is a transform for a node informer used only by this
// controller: it keeps the metadata it reads and drops spec and status,
// which hold most of a Node's size.
func StripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion,
			Labels: n.Labels, Annotations: n.Annotations,
		},
	}, nil
}

// Run waits for the caches and runs workers until ctx is done.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.cacheSynced...) {
		return fmt.Errorf("node labels: caches not synced: %w", context.Cause(ctx))
	}
	logger.Info("Labelling nodes from ResourceSlices", "driver", c.driver, "workers", workers)
	for range max(workers, 1) {
		go wait.UntilWithContext(ctx, c.worker, time.Second)
	}
	<-ctx.Done()
	return nil
}

func (c *Controller) worker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	node, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(node)
	if err := c.Sync(ctx, node); err != nil {
		c.metrics.NodeLabelErrors.Inc()
		klog.FromContext(ctx).Error(err, "Updating node labels failed, will retry", "node", node)
		c.queue.AddRateLimited(node)
		return true
	}
	c.queue.Forget(node)
	return true
}

// Sync brings one node's labels in line with its slices.
func (c *Controller) Sync(ctx context.Context, nodeName string) error {
	node, err := c.nodes.Get(nodeName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	objs, err := c.slices.ByIndex(nodeNameIndex, nodeName)
	if err != nil {
		return err
	}
	slices := make([]*resourceapi.ResourceSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*resourceapi.ResourceSlice); ok {
			slices = append(slices, s)
		}
	}
	desired := Labels(c.driver, slices)
	if c.optedOut(node) {
		desired = map[string]string{}
	}
	p := c.plan(node, desired)
	if p.empty() {
		return nil
	}
	body, err := json.Marshal(p.mergePatch(OwnedAnnotation(c.driver)))
	if err != nil {
		return err
	}
	if _, err := c.client.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "gpu-dra-controller"}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patch labels of node %s: %w", nodeName, err)
	}
	c.metrics.NodeLabelsWritten.WithLabelValues(metrics.ActionSet).Add(float64(len(p.set)))
	c.metrics.NodeLabelsWritten.WithLabelValues(metrics.ActionRemove).Add(float64(len(p.remove)))
	klog.FromContext(ctx).V(2).Info("Updated node labels", "node", klog.KObj(node),
		"set", p.set, "removed", p.remove, "skippedForeign", p.foreign)
	return nil
}

func (c *Controller) optedOut(node *corev1.Node) bool {
	key := OptOutKey(c.driver)
	return node.Labels[key] == OptOutValue || node.Annotations[key] == OptOutValue
}

// patch is what to change on a node.
type patch struct {
	set     map[string]string
	remove  []string
	foreign []string // desired labels someone else set: left alone
	// owned is the new value of OwnedAnnotation; changed says whether it
	// differs from the node's.
	owned        string
	ownedChanged bool
}

func (p *patch) empty() bool { return len(p.set) == 0 && len(p.remove) == 0 && !p.ownedChanged }

func (c *Controller) plan(node *corev1.Node, desired map[string]string) *patch {
	wasOwned := map[string]bool{}
	for _, k := range strings.Split(node.Annotations[OwnedAnnotation(c.driver)], ",") {
		if k = strings.TrimSpace(k); k != "" {
			wasOwned[k] = true
		}
	}
	p := &patch{set: map[string]string{}}
	var owned []string
	for k, v := range desired {
		cur, exists := node.Labels[k]
		switch {
		case exists && !wasOwned[k]:
			p.foreign = append(p.foreign, k)
			continue
		case !exists || cur != v:
			p.set[k] = v
		}
		owned = append(owned, k)
	}
	for k := range wasOwned {
		if _, keep := desired[k]; keep {
			continue
		}
		if _, exists := node.Labels[k]; exists {
			p.remove = append(p.remove, k)
		}
	}
	slices.Sort(owned)
	slices.Sort(p.remove)
	slices.Sort(p.foreign)
	p.owned = strings.Join(owned, ",")
	cur, has := node.Annotations[OwnedAnnotation(c.driver)]
	p.ownedChanged = cur != p.owned || (has && p.owned == "")
	return p
}

// mergePatch is the JSON merge patch: null deletes a key.
func (p *patch) mergePatch(ownedKey string) map[string]any {
	labels := map[string]any{}
	for k, v := range p.set {
		labels[k] = v
	}
	for _, k := range p.remove {
		labels[k] = nil
	}
	meta := map[string]any{}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	if p.ownedChanged {
		if p.owned == "" {
			meta["annotations"] = map[string]any{ownedKey: nil}
		} else {
			meta["annotations"] = map[string]any{ownedKey: p.owned}
		}
	}
	return map[string]any{"metadata": meta}
}
