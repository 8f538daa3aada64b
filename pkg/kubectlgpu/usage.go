package kubectlgpu

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// GPU states in Usage.State.
const (
	StateFree  = "free"
	StateWhole = "whole"
	// StateMIG, StateTimeSlicing and StateMPS are the kinds of the devices
	// in use; StateMixed is more than one of them at once, which only stale
	// allocations can cause.
	StateMIG         = string(vocabulary.KindMIG)
	StateTimeSlicing = string(vocabulary.KindTimeSlice)
	StateMPS         = string(vocabulary.KindMPS)
	StateMixed       = "mixed"
	// StatePassthrough is a GPU whose passthrough device (gpu-N-vfio) is
	// allocated: it is, or will be, bound to vfio-pci for a virtual
	// machine, and none of its other devices can be allocated.
	StatePassthrough = "passthrough"
)

// Usage is how a GPU is used now, from the claims' allocation results.
type Usage struct {
	// State is free, whole, mig, timeslice, mps, passthrough or mixed.
	State string `json:"state"`
	// Whole says the whole GPU is allocated.
	Whole bool `json:"whole,omitempty"`
	// MIG counts the allocated MIG devices by profile.
	MIG []ProfileCount `json:"mig,omitempty"`
	// Shares are the GPU's share devices that have allocations.
	Shares []ShareUsage `json:"shares,omitempty"`
	// Passthrough are the claims (namespace/name) holding the GPU's
	// passthrough device, normally one.
	Passthrough []string `json:"passthrough,omitempty"`
	// Claims hold the GPU or its devices, as namespace/name; an
	// admin-access claim is listed but uses nothing.
	Claims []string `json:"claims,omitempty"`
}

// ProfileCount is a number of MIG devices of one profile.
type ProfileCount struct {
	Profile string `json:"profile"`
	Count   int    `json:"count"`
}

// ShareUsage is what the shares of a time-slicing or MPS device consume.
type ShareUsage struct {
	Type   vocabulary.Kind `json:"type"`
	Device string          `json:"device"`
	// Used and Allowed count shares (capacity "shares").
	Used    int64 `json:"used"`
	Allowed int64 `json:"allowed"`
	// ComputePercent and Memory are the capacity the shares consume.
	ComputePercent int64             `json:"computePercent"`
	Memory         resource.Quantity `json:"memory"`
	// MemoryCapacity is the share device's memory.
	MemoryCapacity resource.Quantity `json:"memoryCapacity"`
}

// Usage says how the GPU is used now.
func (g *GPU) Usage() Usage {
	u := Usage{State: StateFree}
	states := map[string]bool{}
	migCounts := map[string]int{}
	var profiles []string
	for _, d := range g.Devices {
		var share *ShareUsage
		for _, h := range d.Holdings {
			if key := h.Claim.Key(); !slices.Contains(u.Claims, key) {
				u.Claims = append(u.Claims, key)
			}
			if h.AdminAccess {
				continue
			}
			switch d.Type {
			case vocabulary.KindGPU:
				states[StateWhole] = true
				u.Whole = true
			case vocabulary.KindVFIO:
				states[StatePassthrough] = true
				if key := h.Claim.Key(); !slices.Contains(u.Passthrough, key) {
					u.Passthrough = append(u.Passthrough, key)
				}
			case vocabulary.KindMIG:
				states[StateMIG] = true
				if migCounts[d.Profile] == 0 {
					profiles = append(profiles, d.Profile)
				}
				migCounts[d.Profile]++
			case vocabulary.KindTimeSlice, vocabulary.KindMPS:
				states[string(d.Type)] = true
				if share == nil {
					share = newShareUsage(d)
				}
				share.add(h)
			}
		}
		if share != nil {
			u.Shares = append(u.Shares, *share)
		}
	}
	for _, p := range profiles {
		u.MIG = append(u.MIG, ProfileCount{Profile: p, Count: migCounts[p]})
	}
	switch len(states) {
	case 0:
	case 1:
		for s := range states {
			u.State = s
		}
	default:
		u.State = StateMixed
	}
	return u
}

func newShareUsage(d *Device) *ShareUsage {
	s := &ShareUsage{Type: d.Type, Device: d.Name, Memory: *resource.NewQuantity(0, resource.BinarySI)}
	s.Allowed = d.Shares
	s.MemoryCapacity = d.Memory
	return s
}

func (s *ShareUsage) add(h *Holding) {
	if q, ok := h.Consumed[vocabulary.CapacityShares]; ok {
		s.Used += q.Value()
	} else {
		s.Used++
	}
	if q, ok := h.Consumed[vocabulary.CapacityCompute]; ok {
		s.ComputePercent += q.Value()
	}
	if q, ok := h.Consumed[vocabulary.CapacityMemory]; ok {
		s.Memory.Add(q)
	}
}

// FreeMIG are the MIG placements of one profile that are free now.
type FreeMIG struct {
	Profile string `json:"profile"`
	// Placements are the free placements' first memory slices, ascending.
	Placements []int64 `json:"placements"`
	// Devices name the free devices, in the same order.
	Devices []string `json:"devices"`
}

// FreeMIG lists, per profile in publication order, the MIG devices that can
// still be allocated: what they consume of the GPU's counter set (its
// memory slices, compute slices and engines) is not taken by allocated
// devices. A whole GPU or a share takes all of a counter every MIG device
// needs some of (compute-slices), so it leaves none that fits.
// Static MIG devices use no counters; they are free when unallocated.
// A passed-through GPU has none.
func (g *GPU) FreeMIG() []FreeMIG {
	if g.passedThrough() {
		return nil
	}
	remaining := make(map[string]int64, len(g.Counters))
	for k, v := range g.Counters {
		remaining[k] = v.Value.Value()
	}
	held := false
	for _, d := range g.Devices {
		if !d.inUse() {
			continue
		}
		held = true
		for _, c := range d.consumes {
			remaining[c.name] -= c.value
		}
	}
	fits := func(d *Device) bool {
		if d.inUse() {
			return false
		}
		if d.consumes == nil {
			return true
		}
		if g.Counters == nil {
			return !held
		}
		for _, c := range d.consumes {
			if remaining[c.name] < c.value {
				return false
			}
		}
		return true
	}
	var out []FreeMIG
	byProfile := map[string]int{}
	for _, d := range g.Devices {
		if d.Type != vocabulary.KindMIG {
			continue
		}
		i, ok := byProfile[d.Profile]
		if !ok {
			i = len(out)
			byProfile[d.Profile] = i
			out = append(out, FreeMIG{Profile: d.Profile})
		}
		if fits(d) {
			out[i].Placements = append(out[i].Placements, d.PlacementStart)
			out[i].Devices = append(out[i].Devices, d.Name)
		}
	}
	for i := range out {
		sortPlacements(&out[i])
	}
	return slices.DeleteFunc(out, func(f FreeMIG) bool { return len(f.Placements) == 0 })
}

func sortPlacements(f *FreeMIG) {
	idx := make([]int, len(f.Placements))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(f.Placements[a], f.Placements[b]) })
	p, d := make([]int64, len(idx)), make([]string, len(idx))
	for i, j := range idx {
		p[i], d[i] = f.Placements[j], f.Devices[j]
	}
	f.Placements, f.Devices = p, d
}

// inUse says whether a claim without admin access holds the device.
func (d *Device) inUse() bool {
	return slices.ContainsFunc(d.Holdings, func(h *Holding) bool { return !h.AdminAccess })
}

// passedThrough says whether a claim without admin access holds the GPU's
// passthrough device.
func (g *GPU) passedThrough() bool {
	return slices.ContainsFunc(g.Devices, func(d *Device) bool { return d.Type == vocabulary.KindVFIO && d.inUse() })
}

// Unavailable says why a device of a GPU cannot be allocated now.
type Unavailable struct {
	// Reason is "passthrough": the GPU's passthrough device is allocated.
	Reason string `json:"reason"`
	// Claims hold what makes it unavailable, as namespace/name.
	Claims []string `json:"claims,omitempty"`
}

// unavailable says why d cannot be allocated now, nil when nothing known
// rules it out. Only passthrough is told: while the GPU's passthrough
// device is allocated its whole-GPU, MIG and share devices are not
// (the scheduler sees the counters taken). A device already allocated is
// in use, not unavailable.
func (d *Device) unavailable(u Usage) *Unavailable {
	if len(u.Passthrough) == 0 || d.Type == vocabulary.KindVFIO || d.inUse() {
		return nil
	}
	return &Unavailable{Reason: StatePassthrough, Claims: u.Passthrough}
}
