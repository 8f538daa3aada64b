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
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Options configure the published model.
type Options struct {
	// NodeName names the node and its pool (one pool per node).
	NodeName string
	// Policy says what each GPU publishes.
	Policy Policy
	// OwnedMIG reports whether a MIG instance was created by this driver
	// (it is in the checkpoint). Other instances were created out of band
	// and make their GPU a static-MIG GPU.
	OwnedMIG func(parentUUID string, giID uint32) bool
	// NoMPS withholds MPS shares (no MPS control program on the node).
	NoMPS bool
}

// Published is one published device and what the prepare path needs to
// know to hand it out.
type Published struct {
	Device resourceapi.Device
	// Kind says what the device is.
	Kind vocabulary.Kind
	GPU  *discovery.GPU
	// MIGProfile and Placement describe a dynamic MIG device.
	MIGProfile *mig.Profile
	Placement  mig.Placement
	// StaticMIG is the existing instance behind a static MIG device.
	StaticMIG *mig.Instance
}

// Model lists the node's devices, in publication order, and the GPUs'
// counter sets.
func Model(gpus []discovery.GPU, opts Options) ([]Published, []resourceapi.CounterSet) {
	var devices []Published
	var counterSets []resourceapi.CounterSet
	for i := range gpus {
		g := &gpus[i]
		if static := staticInstances(g, opts.OwnedMIG); len(static) > 0 {
			devices = append(devices, staticMIGDevices(g, static)...)
			continue
		}
		policy := opts.Policy.forGPU(g)
		counterSets = append(counterSets, CounterSet(g))
		if policy.wholeGPU {
			devices = append(devices, Published{Device: WholeGPU(g), Kind: vocabulary.KindGPU, GPU: g})
		}
		if policy.timeSlicing > 0 {
			devices = append(devices, Published{Device: ShareDevice(g, vocabulary.KindTimeSlice, policy.timeSlicing), Kind: vocabulary.KindTimeSlice, GPU: g})
		}
		if policy.mps > 0 && !opts.NoMPS {
			devices = append(devices, Published{Device: ShareDevice(g, vocabulary.KindMPS, policy.mps), Kind: vocabulary.KindMPS, GPU: g})
		}
		if g.MIG != nil && policy.mig == MIGDynamic {
			devices = append(devices, dynamicMIGDevices(g, policy.migProfiles)...)
		}
	}
	return devices, counterSets
}

// Build returns the resources the node publishes: one pool named after the
// node; the GPUs' counter sets in slices of their own, then the devices in
// slices within the API's per-slice limits.
func Build(gpus []discovery.GPU, opts Options) resourceslice.DriverResources {
	published, counterSets := Model(gpus, opts)
	return Resources(opts.NodeName, published, counterSets)
}

// Resources lays published devices and counter sets out in slices.
func Resources(poolName string, published []Published, counterSets []resourceapi.CounterSet) resourceslice.DriverResources {
	devices := make([]resourceapi.Device, 0, len(published))
	for _, p := range published {
		devices = append(devices, p.Device)
	}
	var out []resourceslice.Slice
	for len(counterSets) > 0 {
		n := min(resourceapi.ResourceSliceMaxCounterSets, len(counterSets))
		out = append(out, resourceslice.Slice{SharedCounters: counterSets[:n]})
		counterSets = counterSets[n:]
	}
	out = append(out, splitDevices(devices, maxDevicesPerSlice(devices))...)
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{poolName: {Slices: out}},
	}
}

// staticInstances are the GPU's MIG instances this driver did not create.
func staticInstances(g *discovery.GPU, owned func(string, uint32) bool) []mig.Instance {
	if g.MIG == nil {
		return nil
	}
	var out []mig.Instance
	for _, inst := range g.MIG.Instances {
		if owned == nil || !owned(g.UUID, inst.GIID) {
			out = append(out, inst)
		}
	}
	return out
}

// maxDevicesPerSlice is lower for devices that use counters or other
// advanced features.
func maxDevicesPerSlice(devices []resourceapi.Device) int {
	for _, d := range devices {
		if len(d.ConsumesCounters) > 0 || d.AllowMultipleAllocations != nil {
			return resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
		}
	}
	return resourceapi.ResourceSliceMaxDevices
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
