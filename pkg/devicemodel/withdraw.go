package devicemodel

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// Withdraw returns res without the devices that the prepared devices make
// impossible to allocate until an unprepare: a device is withdrawn when one
// of the counters it consumes has less left, after every prepared device
// took its share once, than it needs. So the MIG placements and shares of a
// GPU held whole, the whole GPU and the other strategy of a GPU that is
// shared, and the MIG placements overlapping a prepared MIG device go,
// while MIG placements that still fit beside the prepared ones stay. A
// prepared device itself is never withdrawn (the scheduler counts an
// allocated device's counters only while it is published), nor is a device
// that consumes no counters. Slices keep their place and number, even when
// left empty, so only the slices of GPUs whose prepared devices changed
// differ from the previous publication.
//
// prepared names devices of pool; res is not modified.
func Withdraw(res resourceslice.DriverResources, pool string, prepared map[string]bool) resourceslice.DriverResources {
	p, ok := res.Pools[pool]
	if !ok || len(prepared) == 0 {
		return res
	}
	left := map[string]map[string]resource.Quantity{}
	for _, s := range p.Slices {
		for _, cs := range s.SharedCounters {
			counters := make(map[string]resource.Quantity, len(cs.Counters))
			for name, c := range cs.Counters {
				counters[name] = c.Value.DeepCopy()
			}
			left[cs.Name] = counters
		}
	}
	for _, s := range p.Slices {
		for _, d := range s.Devices {
			if prepared[d.Name] {
				consume(left, d.ConsumesCounters)
			}
		}
	}
	return keepDevices(res, pool, func(d *resourceapi.Device) bool {
		return prepared[d.Name] || fits(left, d.ConsumesCounters)
	})
}

// keepDevices returns res with only the devices of pool that keep
// accepts. Slices keep their place and number, even when left empty, so
// only the slices whose devices changed differ; res is not modified.
func keepDevices(res resourceslice.DriverResources, pool string, keep func(*resourceapi.Device) bool) resourceslice.DriverResources {
	p, ok := res.Pools[pool]
	if !ok {
		return res
	}
	out := resourceslice.DriverResources{Pools: make(map[string]resourceslice.Pool, len(res.Pools))}
	for name, other := range res.Pools {
		out.Pools[name] = other
	}
	slices := make([]resourceslice.Slice, len(p.Slices))
	for i, s := range p.Slices {
		kept := make([]resourceapi.Device, 0, len(s.Devices))
		for j := range s.Devices {
			if keep(&s.Devices[j]) {
				kept = append(kept, s.Devices[j])
			}
		}
		s.Devices = kept
		slices[i] = s
	}
	p.Slices = slices
	out.Pools[pool] = p
	return out
}

// consume takes a device's consumption from what is left of each counter.
func consume(left map[string]map[string]resource.Quantity, consumption []resourceapi.DeviceCounterConsumption) {
	for _, c := range consumption {
		set := left[c.CounterSet]
		if set == nil {
			continue
		}
		for name, n := range c.Counters {
			q, ok := set[name]
			if !ok {
				continue
			}
			q.Sub(n.Value)
			set[name] = q
		}
	}
}

// fits reports whether a device's consumption fits in what is left. A
// counter set or counter the device names that is not published fits: the
// allocator refuses such a pool as invalid, which withdrawal must not hide.
func fits(left map[string]map[string]resource.Quantity, consumption []resourceapi.DeviceCounterConsumption) bool {
	for _, c := range consumption {
		set := left[c.CounterSet]
		for name, n := range c.Counters {
			if q, ok := set[name]; ok && n.Value.Cmp(q) > 0 {
				return false
			}
		}
	}
	return true
}
