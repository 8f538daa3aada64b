package imexchannels

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// The chart's compat.nvidia switch changes the driver name between
// vocabulary.DriverName and vocabulary.NVIDIADriverName. The slice controller
// owns only the slices of its current name, and channel pools have no node,
// so no kubelet removes them: the pools published under the other name
// would stay, selectable by claims of that driver, which no plugin serves
// any more. The controller deletes them when it starts publishing.
//
// A slice is one of them only if all of these hold, so nothing it did not
// publish is touched (NVIDIA's DRA driver publishes under
// vocabulary.NVIDIADriverName too):
//   - its driver is the other known name;
//   - its pool is a channel pool (vocabulary.ChannelPoolName), without
//     nodeName and with a nodeSelector, as Resources makes it;
//   - the API server recorded vocabulary.ControllerAgent, this controller's
//     user agent, as one of its field managers. Only cluster administrators
//     and DRA drivers may write ResourceSlices, and who could forge it could
//     as well delete the slice.
//
// The chart's -controller-resourceslices policy admits exactly this delete.
//
// Leftovers can also appear after the first pass: during a rolling switch
// an instance under the old name still runs for a while, and its slice
// controller recreates the pools deleted under it. The controller looks
// again every defaultLeftoverPeriod, not on slice events: a delete on each
// recreate would duel with that instance as long as it runs, and a list
// with field selectors every few minutes costs less than a watch.

// otherDriverName is the known driver name that is not driver, "" when
// driver is neither: a controller under another name removes nothing.
func otherDriverName(driver string) string {
	switch driver {
	case vocabulary.DriverName:
		return vocabulary.NVIDIADriverName
	case vocabulary.NVIDIADriverName:
		return vocabulary.DriverName
	}
	return ""
}

// leftover says whether slice is a channel slice this controller published
// under driver other (see above).
func leftover(slice *resourceapi.ResourceSlice, other string) bool {
	_, pool := vocabulary.ChannelPoolClique(slice.Spec.Pool.Name)
	return other != "" && slice.Spec.Driver == other && pool &&
		slice.Spec.NodeName == nil && slice.Spec.NodeSelector != nil &&
		slices.ContainsFunc(slice.ManagedFields, func(e metav1.ManagedFieldsEntry) bool {
			return e.Manager == vocabulary.ControllerAgent
		})
}

// removeLeftovers deletes the channel slices published under the other
// driver name, each with its UID and resource version as preconditions.
func (c *Controller) removeLeftovers(ctx context.Context) error {
	other := otherDriverName(c.opts.DriverName)
	if other == "" {
		return nil
	}
	// Slices without a node only, as the slice controller lists its pools:
	// not the nodes' slices of that name (NVIDIA's driver may have many).
	list, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{resourceapi.ResourceSliceSelectorDriver: other, resourceapi.ResourceSliceSelectorNodeName: ""}.String(),
	})
	if err != nil {
		return fmt.Errorf("list ResourceSlices of driver %s: %w", other, err)
	}
	var errs []error
	for i := range list.Items {
		s := &list.Items[i]
		if !leftover(s, other) { // the field selector does not say whose it is
			continue
		}
		err := c.client.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion},
		})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete channel slice %s of driver %s: %w", s.Name, other, err))
			continue
		}
		klog.FromContext(ctx).Info("Deleted a channel slice published under the other driver name", "slice", s.Name, "driver", other, "pool", s.Spec.Pool.Name)
	}
	return errors.Join(errs...)
}

// defaultLeftoverPeriod is how often the leftovers are looked for again
// after a pass succeeded.
const defaultLeftoverPeriod = 3 * time.Minute

// removeLeftoversPeriodically runs removeLeftoversUntilDone, then again
// leftoverPeriod after each pass ends, until ctx is done.
func (c *Controller) removeLeftoversPeriodically(ctx context.Context) {
	period := c.leftoverPeriod
	if period == 0 {
		period = defaultLeftoverPeriod
	}
	wait.UntilWithContext(ctx, c.removeLeftoversUntilDone, period)
}

// removeLeftoversUntilDone retries removeLeftovers with backoff (1s up to
// 5m) until it succeeds or ctx is done.
func (c *Controller) removeLeftoversUntilDone(ctx context.Context) {
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Steps: math.MaxInt32, Cap: 5 * time.Minute}
	_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		if err := c.removeLeftovers(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Removing channel slices published under the other driver name; retrying")
			return false, nil
		}
		return true, nil
	})
}
