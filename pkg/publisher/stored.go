package publisher

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// Stored reads the node's slices as the API server stores them.
type Stored interface {
	// Slices lists the stored slices of one of the node's pools.
	Slices(pool string) []*resourceapi.ResourceSlice
}

// WatchSlices keeps a cache of the driver's slices on node until ctx ends:
// the one watch the publisher adds to the slice controller's own, so it
// knows when an update is stored before it publishes the next.
func WatchSlices(ctx context.Context, client kubernetes.Interface, driver, node string) Stored {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, node).String()
	}))
	informer := factory.Resource().V1().ResourceSlices().Informer()
	factory.Start(ctx.Done())
	return &watched{store: informer.GetStore(), driver: driver, node: node}
}

type watched struct {
	store        interface{ List() []any }
	driver, node string
}

func (w *watched) Slices(pool string) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for _, obj := range w.store.List() {
		s, ok := obj.(*resourceapi.ResourceSlice)
		if ok && s.Spec.Driver == w.driver && s.Spec.Pool.Name == pool && s.Spec.NodeName != nil && *s.Spec.NodeName == w.node {
			out = append(out, s)
		}
	}
	return out
}

// confirm waits until the stored slice at index has the devices and taints
// of that slice in res, or timeout passes.
func confirm(ctx context.Context, stored Stored, index sliceIndex, res *resourceslice.DriverResources, timeout time.Duration) error {
	want := res.Pools[index.pool].Slices
	prefix := devicemodel.SliceIndexPrefix(index.slice, len(want))
	return wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		for _, s := range stored.Slices(index.pool) {
			if strings.HasPrefix(s.Name, prefix) && s.Spec.Pool.ResourceSliceCount == int64(len(want)) &&
				sameDeviceTaints(s.Spec.Devices, want[index.slice].Devices) {
				return true, nil
			}
		}
		return false, nil
	})
}

// sameDeviceTaints compares devices by name and taints (key, value,
// effect): the slice controller rounds the taints' TimeAdded.
func sameDeviceTaints(stored, want []resourceapi.Device) bool {
	if len(stored) != len(want) {
		return false
	}
	for i := range want {
		if stored[i].Name != want[i].Name || len(stored[i].Taints) != len(want[i].Taints) {
			return false
		}
		for j, t := range want[i].Taints {
			st := stored[i].Taints[j]
			if st.Key != t.Key || st.Value != t.Value || st.Effect != t.Effect {
				return false
			}
		}
	}
	return true
}

// sortedPools lists the pools of res by name, so steps go in a stable order.
func sortedPools(res resourceslice.DriverResources) []string {
	return slices.Sorted(maps.Keys(res.Pools))
}
