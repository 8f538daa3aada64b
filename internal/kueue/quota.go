package kueue

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// The quota resources of a team's ClusterQueue besides nvidia.com/gpu, which
// Kueue counts as it counts any extended resource of a container.
const (
	// ResourceComputeSlices and ResourceMemorySlices are what a MIG device
	// costs: the GPU counters its profile consumes (pkg/devicemodel counts
	// compute slices in total and one counter per memory slice). Kueue's
	// resources.transformations turn a pod's nvidia.com/mig-<profile> into
	// them, so a 7g device costs seven times a 1g one.
	ResourceComputeSlices = vocabulary.DriverName + "/mig-compute-slices"
	ResourceMemorySlices  = vocabulary.DriverName + "/mig-memory-slices"
	// ResourceMPSShares counts the claims of the MPS share class: Kueue's
	// resources.deviceClassMappings count a claim's devices per class.
	ResourceMPSShares = vocabulary.DriverName + "/mps-shares"
)

// Cost is what one MIG device of a profile consumes of its GPU's counters.
type Cost struct {
	ComputeSlices, MemorySlices int64
}

// ProfileCosts reads each MIG profile's cost off published ResourceSlices: the
// compute-slices counter and the number of memory-slice counters its devices
// consume. Every placement of a profile costs the same; a profile whose
// devices disagree (two GPU models publishing one profile name differently) is
// an error, since one transformation per name could not charge both right.
func ProfileCosts(list []resourceapi.ResourceSlice, driver string) (map[string]Cost, error) {
	costs := map[string]Cost{}
	for _, s := range list {
		if s.Spec.Driver != driver {
			continue
		}
		for _, d := range s.Spec.Devices {
			profile := d.Attributes[vocabulary.AttrProfile].StringValue
			if profile == nil {
				continue
			}
			c, err := deviceCost(d)
			if err != nil {
				return nil, fmt.Errorf("ResourceSlice %s device %s: %w", s.Name, d.Name, err)
			}
			if old, ok := costs[*profile]; ok && old != c {
				return nil, fmt.Errorf("profile %s: device %s in ResourceSlice %s costs %+v, another %+v", *profile, d.Name, s.Name, c, old)
			}
			costs[*profile] = c
		}
	}
	if len(costs) == 0 {
		return nil, fmt.Errorf("no MIG devices (attribute %s) published by %s", vocabulary.AttrProfile, driver)
	}
	return costs, nil
}

func deviceCost(d resourceapi.Device) (Cost, error) {
	var c Cost
	for _, cc := range d.ConsumesCounters {
		for name, v := range cc.Counters {
			switch {
			case name == vocabulary.CounterComputeSlices:
				c.ComputeSlices += v.Value.Value()
			case strings.HasPrefix(name, strings.TrimSuffix(vocabulary.MemorySliceCounter(0), "0")):
				c.MemorySlices += v.Value.Value()
			}
		}
	}
	if c.ComputeSlices == 0 || c.MemorySlices == 0 {
		return c, fmt.Errorf("consumes no %s or no memory-slice counters", vocabulary.CounterComputeSlices)
	}
	return c, nil
}

// Transformation is one entry of Kueue's resources.transformations.
type Transformation struct {
	Input    string           `json:"input"`
	Strategy string           `json:"strategy"`
	Outputs  map[string]int64 `json:"outputs"`
}

// Transformations charges each profile's nvidia.com/mig-<profile> as its cost,
// in profile order.
func Transformations(costs map[string]Cost) []Transformation {
	var out []Transformation
	for _, p := range slices.Sorted(maps.Keys(costs)) {
		c := costs[p]
		out = append(out, Transformation{
			Input:    vocabulary.MIGResourceName(p),
			Strategy: "Replace",
			Outputs:  map[string]int64{ResourceComputeSlices: c.ComputeSlices, ResourceMemorySlices: c.MemorySlices},
		})
	}
	return out
}

// Largest is the cost of the largest profile: a whole GPU's worth of MIG.
func Largest(costs map[string]Cost) Cost {
	var m Cost
	for _, c := range costs {
		m.ComputeSlices = max(m.ComputeSlices, c.ComputeSlices)
		m.MemorySlices = max(m.MemorySlices, c.MemorySlices)
	}
	return m
}
