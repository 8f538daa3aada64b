package modelclasses

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	resourceinformers "k8s.io/client-go/informers/resource/v1"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
)

// DefaultGracePeriod is how long a model must be gone before its class is
// deleted: slices disappear for a while when a node reboots or its plugin
// is upgraded, and deleting a class makes pending claims for it
// unschedulable.
const DefaultGracePeriod = 5 * time.Minute

// key is the single work item: the controller always reconciles all classes.
const key = "all"

// Options configure the Controller.
type Options struct {
	DriverName string
	// Models keeps one class per GPU model, MIGProfiles one per MIG
	// profile (ProfileDeviceClasses); at least one must be set.
	Models, MIGProfiles bool
	// GracePeriod: see DefaultGracePeriod; 0 deletes at once.
	GracePeriod time.Duration
	Clock       clock.PassiveClock
	Metrics     *metrics.Metrics
}

// Controller creates, updates and deletes the per-model DeviceClasses.
type Controller struct {
	client  kubernetes.Interface
	opts    Options
	metrics *metrics.Metrics

	slices      resourcelisters.ResourceSliceLister
	classes     resourcelisters.DeviceClassLister
	cacheSynced []cache.InformerSynced
	queue       workqueue.TypedRateLimitingInterface[string]

	// goneSince is when each managed class's model was first seen missing.
	goneSince map[string]time.Time
}

// New creates the controller and registers its event handlers. The
// DeviceClass informer may be filtered to ModelClassLabel.
func New(client kubernetes.Interface, sliceInformer resourceinformers.ResourceSliceInformer, classInformer resourceinformers.DeviceClassInformer, opts Options) (*Controller, error) {
	if opts.DriverName == "" {
		return nil, errors.New("model classes: no driver name")
	}
	if !opts.Models && !opts.MIGProfiles {
		return nil, errors.New("model classes: neither Models nor MIGProfiles is set")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	c := &Controller{
		client:    client,
		opts:      opts,
		metrics:   metrics.OrNew(opts.Metrics),
		slices:    sliceInformer.Lister(),
		classes:   classInformer.Lister(),
		goneSince: map[string]time.Time{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpu_dra_model_classes"}),
	}
	enqueue := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.queue.Add(key) },
		UpdateFunc: func(any, any) { c.queue.Add(key) },
		DeleteFunc: func(any) { c.queue.Add(key) },
	}
	sliceReg, err := sliceInformer.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: func(obj any) bool {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			s, ok := obj.(*resourceapi.ResourceSlice)
			return ok && s.Spec.Driver == opts.DriverName
		},
		Handler: enqueue,
	})
	if err != nil {
		return nil, err
	}
	classReg, err := classInformer.Informer().AddEventHandler(enqueue)
	if err != nil {
		return nil, err
	}
	c.cacheSynced = []cache.InformerSynced{sliceReg.HasSynced, classReg.HasSynced}
	return c, nil
}

// Run waits for the caches and reconciles until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer c.queue.ShutDown()
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.cacheSynced...) {
		return fmt.Errorf("model classes: caches not synced: %w", context.Cause(ctx))
	}
	klog.FromContext(ctx).Info("Managing per-model DeviceClasses", "driver", c.opts.DriverName, "models", c.opts.Models, "migProfiles", c.opts.MIGProfiles, "gracePeriod", c.opts.GracePeriod)
	c.queue.Add(key)
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		for c.processNext(ctx) {
		}
	}, time.Second)
	<-ctx.Done()
	return nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	item, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(item)
	recheck, err := c.Sync(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reconciling per-model DeviceClasses failed, will retry")
		c.queue.AddRateLimited(item)
		return true
	}
	c.queue.Forget(item)
	if recheck > 0 {
		c.queue.AddAfter(item, recheck)
	}
	return true
}

// Sync creates the classes of the models in the slices, updates managed
// classes that drifted, and deletes managed classes whose model has been
// gone for the grace period. It returns when to look again (0: only on
// the next event).
func (c *Controller) Sync(ctx context.Context) (time.Duration, error) {
	logger := klog.FromContext(ctx)
	slices, err := c.slices.List(labels.Everything())
	if err != nil {
		return 0, err
	}
	var want []*resourceapi.DeviceClass
	if c.opts.Models {
		want = DeviceClasses(c.opts.DriverName, Products(c.opts.DriverName, slices))
	}
	if c.opts.MIGProfiles {
		want = append(want, ProfileDeviceClasses(c.opts.DriverName, Profiles(c.opts.DriverName, slices))...)
	}
	desired := map[string]*resourceapi.DeviceClass{}
	for _, dc := range want {
		desired[dc.Name] = dc
	}
	all, err := c.classes.List(labels.Everything())
	if err != nil {
		return 0, err
	}
	existing := map[string]*resourceapi.DeviceClass{}
	for _, dc := range all {
		existing[dc.Name] = dc
	}
	classes := c.client.ResourceV1().DeviceClasses()
	var errs []error

	for name, want := range desired {
		delete(c.goneSince, name)
		cur, ok := existing[name]
		switch {
		case !ok:
			if _, err := classes.Create(ctx, want, metav1.CreateOptions{}); err != nil {
				if apierrors.IsAlreadyExists(err) { // not ours, or not in the (filtered) cache yet
					logger.V(2).Info("DeviceClass exists but is not managed here; leaving it alone", "deviceClass", name)
					continue
				}
				errs = append(errs, fmt.Errorf("create DeviceClass %s: %w", name, err))
				continue
			}
			c.metrics.ModelClassChanges.WithLabelValues("create").Inc()
			logger.Info("Created per-model DeviceClass", "deviceClass", name, "products", want.Annotations[ProductAnnotation(c.opts.DriverName)])
		case !c.managed(cur):
			logger.V(2).Info("DeviceClass exists but is not managed here; leaving it alone", "deviceClass", name)
		case !upToDate(cur, want):
			upd := cur.DeepCopy()
			maps.Copy(upd.Labels, want.Labels)
			if upd.Annotations == nil {
				upd.Annotations = map[string]string{}
			}
			maps.Copy(upd.Annotations, want.Annotations)
			upd.Spec = want.Spec
			if _, err := classes.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
				errs = append(errs, fmt.Errorf("update DeviceClass %s: %w", name, err))
				continue
			}
			c.metrics.ModelClassChanges.WithLabelValues("update").Inc()
			logger.Info("Updated per-model DeviceClass", "deviceClass", name)
		}
	}

	now := c.opts.Clock.Now()
	var recheck time.Duration
	for name, cur := range existing {
		if _, ok := desired[name]; ok || !c.managed(cur) {
			continue
		}
		since, ok := c.goneSince[name]
		if !ok {
			since = now
			c.goneSince[name] = now
			logger.Info("GPU model or MIG profile gone; deleting its DeviceClass after the grace period", "deviceClass", name, "gracePeriod", c.opts.GracePeriod)
		}
		if left := c.opts.GracePeriod - now.Sub(since); left > 0 {
			if recheck == 0 || left < recheck {
				recheck = left
			}
			continue
		}
		err := classes.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cur.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete DeviceClass %s: %w", name, err))
			continue
		}
		delete(c.goneSince, name)
		c.metrics.ModelClassChanges.WithLabelValues("delete").Inc()
		logger.Info("Deleted per-model DeviceClass", "deviceClass", name)
	}
	for name := range c.goneSince {
		if _, ok := existing[name]; !ok {
			delete(c.goneSince, name)
		}
	}
	return recheck, errors.Join(errs...)
}

func (c *Controller) managed(dc *resourceapi.DeviceClass) bool {
	return dc.Labels[ModelClassLabel(c.opts.DriverName)] == "true"
}

// upToDate: the class has want's spec and carries its labels and
// annotations (others may add more).
func upToDate(cur, want *resourceapi.DeviceClass) bool {
	for k, v := range want.Labels {
		if cur.Labels[k] != v {
			return false
		}
	}
	for k, v := range want.Annotations {
		if cur.Annotations[k] != v {
			return false
		}
	}
	return apiequality.Semantic.DeepEqual(cur.Spec, want.Spec)
}
