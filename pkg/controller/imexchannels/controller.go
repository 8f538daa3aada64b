package imexchannels

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Options configure the Controller.
type Options struct {
	// DriverName is the driver the slices are published for.
	DriverName string
	// Channels is the number of channels per clique (1..MaxChannels).
	Channels int
}

// Controller publishes one channel pool per clique that a node's clique
// label names, and removes a pool once no node names its clique.
type Controller struct {
	client   kubernetes.Interface
	opts     Options
	nodes    corelisters.NodeLister
	synced   cache.InformerSynced
	changed  chan struct{}
	onUpdate func([]string) // tests: called with the cliques after each update
	// leftoverPeriod is how often the leftovers are looked for again; 0
	// is defaultLeftoverPeriod (leftovers.go).
	leftoverPeriod time.Duration
}

// New creates the controller and registers its event handler on the node
// informer (which may be shared and stripped to metadata).
func New(client kubernetes.Interface, nodeInformer coreinformers.NodeInformer, opts Options) (*Controller, error) {
	if opts.DriverName == "" {
		return nil, fmt.Errorf("IMEX channels: no driver name")
	}
	if err := ValidateChannels("IMEX channels per clique", opts.Channels); err != nil {
		return nil, err
	}
	c := &Controller{client: client, opts: opts, nodes: nodeInformer.Lister(), changed: make(chan struct{}, 1)}
	reg, err := nodeInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { c.poke() },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			n, ok2 := cur.(*corev1.Node)
			if ok1 && ok2 && o.Labels[labelKey] == n.Labels[labelKey] {
				return
			}
			c.poke()
		},
		DeleteFunc: func(any) { c.poke() },
	})
	if err != nil {
		return nil, err
	}
	c.synced = reg.HasSynced
	return c, nil
}

func (c *Controller) poke() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// cliques are the valid cliques of the nodes in the cache.
func (c *Controller) cliques(ctx context.Context) []string {
	nodes, err := c.nodes.List(labels.Everything())
	if err != nil { // a cache lister does not fail
		klog.FromContext(ctx).Error(err, "List nodes")
	}
	cliques, invalid := Cliques(nodes)
	if len(invalid) > 0 {
		klog.FromContext(ctx).Info("Node clique labels that name no valid pool are ignored", "label", labelKey, "values", invalid)
	}
	return cliques
}

// Run publishes the pools until ctx is done. It starts publishing only
// once the node cache has synced, so a restart never takes the pools of
// cliques it has not seen yet away. It also deletes the pools it published
// under the other driver name before a compat.nvidia switch (leftovers.go).
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("imex-channels")
	ctx = klog.NewContext(ctx, logger)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced) {
		return nil
	}
	cliques := c.cliques(ctx)
	publisher, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: c.opts.DriverName,
		KubeClient: c.client,
		Resources:  Resources(cliques, c.opts.Channels),
		ErrorHandler: func(ctx context.Context, err error, msg string) {
			klog.FromContext(ctx).Error(err, "Publishing IMEX channel slices: "+msg)
		},
	})
	if err != nil {
		return fmt.Errorf("IMEX channel slices: %w", err)
	}
	defer publisher.Stop()
	logger.Info("Publishing IMEX channels", "cliques", cliques, "channelsPerClique", c.opts.Channels)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { c.removeLeftoversPeriodically(ctx) })
	c.updated(cliques)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.changed:
		}
		now := c.cliques(ctx)
		if slices.Equal(now, cliques) {
			continue
		}
		logger.Info("Cliques changed", "cliques", now, "before", cliques)
		cliques = now
		publisher.Update(Resources(cliques, c.opts.Channels))
		c.updated(cliques)
	}
}

func (c *Controller) updated(cliques []string) {
	if c.onUpdate != nil {
		c.onUpdate(slices.Clone(cliques))
	}
}

// labelKey is the node label the pools follow.
const labelKey = vocabulary.LabelClique
