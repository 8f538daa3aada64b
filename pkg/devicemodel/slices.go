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
		if policy.passthrough {
			devices = append(devices, Published{Device: VFIODevice(g), Kind: vocabulary.KindVFIO, GPU: g})
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

// Resources lays published devices and counter sets out in slices: the
// counter sets in slices of their own, then each GPU's devices in slices of
// their own, in publication order. The layout comes from the full model, so
// withdrawing devices (Withdraw) never moves a device to another slice nor
// changes the number of slices: a prepare or unprepare on one GPU changes
// only that GPU's slice, which the slice controller writes in one update
// without bumping the pool's generation, so the pool never looks incomplete
// to the scheduler (docs/device-model.md, "What is published when").
func Resources(poolName string, published []Published, counterSets []resourceapi.CounterSet) resourceslice.DriverResources {
	var out []resourceslice.Slice
	for len(counterSets) > 0 {
		n := min(resourceapi.ResourceSliceMaxCounterSets, len(counterSets))
		out = append(out, resourceslice.Slice{SharedCounters: counterSets[:n]})
		counterSets = counterSets[n:]
	}
	for _, group := range byGPU(published) {
		out = append(out, splitDevices(group, maxDevicesPerSlice(group))...)
	}
	if len(published) == 0 {
		// An empty pool still publishes one empty slice, so the scheduler
		// knows the node has no devices rather than waiting for them.
		out = append(out, resourceslice.Slice{})
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{poolName: {Slices: out}},
	}
}

// byGPU groups the devices by the GPU they are carved from, keeping the
// order of first appearance (the model lists each GPU's devices together).
func byGPU(published []Published) [][]resourceapi.Device {
	var groups [][]resourceapi.Device
	index := map[*discovery.GPU]int{}
	for _, p := range published {
		i, ok := index[p.GPU]
		if !ok {
			i = len(groups)
			index[p.GPU] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], p.Device)
	}
	return groups
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
		for i, s := range pool.Slices {
			out = append(out, &resourceapi.ResourceSlice{
				TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceSlice"},
				ObjectMeta: metav1.ObjectMeta{
					GenerateName: SliceIndexPrefix(i, len(pool.Slices)) + driverName + "-" + nodeName + "-",
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

// SliceIndexPrefix is how the slice controller of
// k8s.io/dynamic-resource-allocation starts the name of slice i of a pool of
// count slices: its index in hex, at least five digits, and "-".
func SliceIndexPrefix(i, count int) string {
	width := max(5, len(strconv.FormatInt(int64(count-1), 16)))
	return fmt.Sprintf("%0*x-", width, i)
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
