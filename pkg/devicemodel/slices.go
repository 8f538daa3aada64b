package devicemodel

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
)

// Options configure the published model.
type Options struct {
	// NodeName names the node and its pool (one pool per node).
	NodeName string
}

// Build returns the resources the node publishes: one pool named after the
// node, its devices split into slices within the API's per-slice limit.
func Build(gpus []discovery.GPU, opts Options) resourceslice.DriverResources {
	devices := make([]resourceapi.Device, 0, len(gpus))
	for i := range gpus {
		devices = append(devices, WholeGPU(&gpus[i]))
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			opts.NodeName: {Slices: splitDevices(devices, resourceapi.ResourceSliceMaxDevices)},
		},
	}
}

// splitDevices chunks devices into slices of at most max devices, keeping
// their order: the allocator is first-fit over slices sorted by name, and the
// slice controller names slices by their index.
func splitDevices(devices []resourceapi.Device, max int) []resourceslice.Slice {
	var out []resourceslice.Slice
	for len(devices) > 0 {
		n := min(max, len(devices))
		out = append(out, resourceslice.Slice{Devices: devices[:n]})
		devices = devices[n:]
	}
	if out == nil {
		// An empty pool still publishes one empty slice, so the scheduler
		// knows the node has no devices rather than waiting for them.
		out = []resourceslice.Slice{{}}
	}
	return out
}

// ResourceSlices renders resources as the ResourceSlice objects the slice
// controller of k8s.io/dynamic-resource-allocation creates for them on first
// publication: same generateName scheme and pool generation 1. The API
// server completes the name; the controller adds the Node as owner.
func ResourceSlices(resources resourceslice.DriverResources, driverName, nodeName string) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for _, poolName := range slices.Sorted(maps.Keys(resources.Pools)) {
		pool := resources.Pools[poolName]
		width := max(5, len(strconv.FormatInt(int64(len(pool.Slices)-1), 16)))
		for i, s := range pool.Slices {
			out = append(out, &resourceapi.ResourceSlice{
				TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
				ObjectMeta: metav1.ObjectMeta{
					GenerateName: fmt.Sprintf("%0*x-%s-%s-", width, i, driverName, nodeName),
				},
				Spec: resourceapi.ResourceSliceSpec{
					Driver: driverName,
					Pool: resourceapi.ResourcePool{
						Name:               poolName,
						Generation:         max(1, pool.Generation),
						ResourceSliceCount: int64(len(pool.Slices)),
					},
					NodeName:       ptr.To(nodeName),
					Devices:        s.Devices,
					SharedCounters: s.SharedCounters,
				},
			})
		}
	}
	return out
}

// WriteYAML writes the slices as a YAML stream ("---" separated).
func WriteYAML(w io.Writer, slices []*resourceapi.ResourceSlice) error {
	for _, s := range slices {
		data, err := yaml.Marshal(s)
		if err != nil {
			return fmt.Errorf("marshal ResourceSlice %s: %w", s.GenerateName, err)
		}
		if _, err := fmt.Fprintf(w, "---\n%s", data); err != nil {
			return err
		}
	}
	return nil
}
