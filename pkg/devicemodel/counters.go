package devicemodel

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
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

// consumeAll is the consumption of a device that takes the whole GPU.
func consumeAll(g *discovery.GPU) []resourceapi.DeviceCounterConsumption {
	return []resourceapi.DeviceCounterConsumption{{CounterSet: CounterSetName(g), Counters: gpuCounters(g)}}
}

func count(n int) resourceapi.Counter {
	return resourceapi.Counter{Value: *resource.NewQuantity(int64(n), resource.DecimalSI)}
}
