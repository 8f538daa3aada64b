package devicemodel

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// CounterSetName names the counter set of a GPU.
func CounterSetName(g *discovery.GPU) string { return g.CanonicalName() }

// gpuCounters is everything a GPU has (counter names in pkg/vocabulary).
// One counter per memory slice encodes MIG placement: a MIG device consumes
// exactly the slices its placement covers, so overlapping placements exclude
// each other, as on the hardware. Compute slices and media engines are
// counted in total; the +me profiles differ from their plain twins only
// there. A GPU without MIG has a single memory slice: whoever uses it uses
// all of it.
func gpuCounters(g *discovery.GPU) map[string]resourceapi.Counter {
	counters := map[string]resourceapi.Counter{}
	if g.MIG == nil {
		counters[vocabulary.MemorySliceCounter(0)] = count(1)
		return counters
	}
	for i := range g.MIG.MemorySlices {
		counters[vocabulary.MemorySliceCounter(i)] = count(1)
	}
	counters[vocabulary.CounterComputeSlices] = count(g.MIG.ComputeSlices)
	counters[vocabulary.CounterDecoders] = count(g.MIG.Decoders)
	counters[vocabulary.CounterEncoders] = count(g.MIG.Encoders)
	counters[vocabulary.CounterJPEGEngines] = count(g.MIG.JPEGs)
	counters[vocabulary.CounterOFAEngines] = count(g.MIG.OFAs)
	return counters
}

// CounterSet is the GPU's shared counters, published in a slice of their own.
func CounterSet(g *discovery.GPU) resourceapi.CounterSet {
	return resourceapi.CounterSet{Name: CounterSetName(g), Counters: gpuCounters(g)}
}

// consumeWhole is the consumption of a device that takes the whole GPU (the
// whole GPU itself, a share device): one counter at its full value, the
// lean layout. On a GPU with MIG that counter is compute-slices, of which
// every MIG placement consumes at least one, so a device consuming all of
// it excludes every MIG device, every other such device, and nothing else,
// exactly as consuming every counter did; the allocator checks one counter
// per candidate instead of 13 (on an H100). A GPU without MIG has the one
// memory-slice counter. Should a GPU list a MIG profile that consumes no
// compute slice, its whole-GPU devices consume every counter, as before:
// compute-slices alone would not exclude that profile.
func consumeWhole(g *discovery.GPU) []resourceapi.DeviceCounterConsumption {
	counters := gpuCounters(g)
	if g.MIG != nil && g.MIG.ComputeSlices > 0 && !slices.ContainsFunc(g.MIG.Profiles, func(p mig.Profile) bool { return p.ComputeSlices < 1 }) {
		counters = map[string]resourceapi.Counter{vocabulary.CounterComputeSlices: count(g.MIG.ComputeSlices)}
	}
	return []resourceapi.DeviceCounterConsumption{{CounterSet: CounterSetName(g), Counters: counters}}
}

func count(n int) resourceapi.Counter {
	return resourceapi.Counter{Value: *resource.NewQuantity(int64(n), resource.DecimalSI)}
}
