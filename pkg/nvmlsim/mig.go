package nvmlsim

import (
	"sort"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// MIG state and the rules NVML enforces. Every function here expects Machine.mu to be held.
//
// MIG mode changes are simulated as on bare metal, where nvmlDeviceSetMigMode resets the idle GPU
// itself: the new mode is current at once (activation status SUCCESS) and nothing like
// NVML_ERROR_RESET_REQUIRED (pass-through VMs) is reported. Disabling MIG while GPU instances
// exist fails with ERROR_IN_USE.
//
// Placement choice when the caller gives none (CreateGpuInstance, CreateComputeInstance): NVML
// picks the free placement that leaves the most placements, over all profiles, still free,
// ties going to the lowest start. This reproduces every sequence in the MIG User Guide's
// "Instance Geometry" examples (e.g. seven 1g.5gb creations get GPU-instance IDs 13, 11, 12, 7,
// 8, 9, 10). GPU-instance IDs follow from placements (giID); compute-instance IDs are the
// lowest free ID, as `nvidia-smi mig -cci 0,0,0` shows (0, 1, 2).

// gpuInstance is a GPU instance (GI).
type gpuInstance struct {
	gpu              *gpu
	id               uint32
	profile          *giProfile
	start            uint32
	handle           *mock.GpuInstance
	computeInstances map[uint32]*computeInstance
	destroyed        bool
}

// computeInstance is a compute instance (CI) and the MIG device it forms.
type computeInstance struct {
	gi        *gpuInstance
	id        uint32
	profile   *ciProfile
	start     uint32
	uuid      string
	handle    *mock.ComputeInstance
	migDevice *mock.Device
	destroyed bool
}

type span struct{ start, size uint32 }

func (a span) overlaps(b span) bool {
	return a.start < b.start+b.size && b.start < a.start+a.size
}

func (gi *gpuInstance) span() span { return span{gi.start, gi.profile.size} }

func (ci *computeInstance) span() span { return span{ci.start, ci.profile.slices} }

func (g *gpu) migEnabled() bool { return g.migCurrent == nvml.DEVICE_MIG_ENABLE }

func (gi *gpuInstance) sortedComputeInstances() []*computeInstance {
	out := make([]*computeInstance, 0, len(gi.computeInstances))
	for _, ci := range gi.computeInstances {
		out = append(out, ci)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// setMigMode implements SetMigMode: (activation status, result).
func (g *gpu) setMigMode(mode int) (nvml.Return, nvml.Return) {
	if g.spec.mig == nil {
		return nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NOT_SUPPORTED
	}
	if mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE {
		return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
	}
	if mode == nvml.DEVICE_MIG_DISABLE && len(g.gpuInstances) > 0 {
		return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
	}
	oldCurrent, oldPending := g.migCurrent, g.migPending
	g.migCurrent, g.migPending = mode, mode
	if ret := g.m.commit(func() { g.migCurrent, g.migPending = oldCurrent, oldPending }); ret != nvml.SUCCESS {
		return ret, ret
	}
	return nvml.SUCCESS, nvml.SUCCESS
}

// giSpans returns the memory-slice spans of g's GPU instances.
func (g *gpu) giSpans() []span {
	var spans []span
	for _, gi := range g.gpuInstances {
		spans = append(spans, gi.span())
	}
	return spans
}

func free(s span, used []span) bool {
	for _, u := range used {
		if s.overlaps(u) {
			return false
		}
	}
	return true
}

func (g *gpu) giCount(p *giProfile) uint32 {
	n := uint32(0)
	for _, gi := range g.gpuInstances {
		if gi.profile == p {
			n++
		}
	}
	return n
}

// freeStarts returns the starts of size-long placements among starts that do not overlap used.
func freeStarts(starts []uint32, size uint32, used []span) []uint32 {
	var out []uint32
	for _, s := range starts {
		if free(span{s, size}, used) {
			out = append(out, s)
		}
	}
	return out
}

// packable returns how many non-overlapping placements fit among the free starts.
func packable(starts []uint32, size uint32) uint32 {
	n, end := uint32(0), uint32(0)
	for i, s := range starts {
		if i == 0 || s >= end {
			n++
			end = s + size
		}
	}
	return n
}

// giRemaining implements GetGpuInstanceRemainingCapacity.
func (g *gpu) giRemaining(p *giProfile) uint32 {
	count := g.giCount(p)
	if count >= p.instances {
		return 0
	}
	return min(p.instances-count, packable(freeStarts(p.starts, p.size, g.giSpans()), p.size))
}

// chooseGIStart picks NVML's default placement for a new GPU instance of profile p.
func (g *gpu) chooseGIStart(p *giProfile) (uint32, bool) {
	used := g.giSpans()
	best, bestScore, ok := uint32(0), -1, false
	for _, s := range freeStarts(p.starts, p.size, used) {
		after := append(append([]span(nil), used...), span{s, p.size})
		score := 0
		for k := range g.spec.mig.profiles {
			q := &g.spec.mig.profiles[k]
			count := g.giCount(q)
			if q == p {
				count++
			}
			if count < q.instances {
				score += len(freeStarts(q.starts, q.size, after))
			}
		}
		if score > bestScore {
			best, bestScore, ok = s, score, true
		}
	}
	return best, ok
}

// createGI implements CreateGpuInstance(WithPlacement); start nil lets NVML choose.
func (g *gpu) createGI(info *nvml.GpuInstanceProfileInfo, start *uint32, size uint32) (*gpuInstance, nvml.Return) {
	if g.spec.mig == nil || !g.migEnabled() {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	p := g.spec.mig.byID(info.Id)
	if p == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if g.giCount(p) >= p.instances {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	var s uint32
	if start != nil {
		if size != p.size || !containsStart(p.starts, *start) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if !free(span{*start, p.size}, g.giSpans()) {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		s = *start
	} else {
		var ok bool
		if s, ok = g.chooseGIStart(p); !ok {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	}
	gi := g.addGI(giID(s, p.size), p, s)
	if ret := g.m.commit(func() { gi.remove() }); ret != nvml.SUCCESS {
		return nil, ret
	}
	g.m.deliverLocked(g.index, nvml.EventMigConfigChange, 0, noInstance, noInstance)
	return gi, nvml.SUCCESS
}

func containsStart(starts []uint32, s uint32) bool {
	for _, x := range starts {
		if x == s {
			return true
		}
	}
	return false
}

// addGI records a GPU instance and builds its handle.
func (g *gpu) addGI(id uint32, p *giProfile, start uint32) *gpuInstance {
	gi := &gpuInstance{gpu: g, id: id, profile: p, start: start, computeInstances: map[uint32]*computeInstance{}}
	gi.handle = gi.newHandle()
	g.gpuInstances[id] = gi
	return gi
}

func (gi *gpuInstance) remove() {
	gi.destroyed = true
	delete(gi.gpu.gpuInstances, gi.id)
}

// destroyGI implements GpuInstance.Destroy.
func (gi *gpuInstance) destroyGI() nvml.Return {
	if len(gi.computeInstances) > 0 {
		return nvml.ERROR_IN_USE
	}
	gi.remove()
	g := gi.gpu
	if ret := g.m.commit(func() { gi.destroyed = false; g.gpuInstances[gi.id] = gi }); ret != nvml.SUCCESS {
		return ret
	}
	g.m.deliverLocked(g.index, nvml.EventMigConfigChange, 0, noInstance, noInstance)
	return nvml.SUCCESS
}

func (gi *gpuInstance) ciSpans() []span {
	var spans []span
	for _, ci := range gi.computeInstances {
		spans = append(spans, ci.span())
	}
	return spans
}

func (gi *gpuInstance) ciCount(index int) uint32 {
	n := uint32(0)
	for _, ci := range gi.computeInstances {
		if ci.profile.index == index {
			n++
		}
	}
	return n
}

// ciRemaining implements GetComputeInstanceRemainingCapacity.
func (gi *gpuInstance) ciRemaining(p *ciProfile) uint32 {
	count := gi.ciCount(p.index)
	if count >= p.instances {
		return 0
	}
	return min(p.instances-count, packable(freeStarts(p.starts, p.slices, gi.ciSpans()), p.slices))
}

// chooseCIStart picks the default placement of a new compute instance, like chooseGIStart.
func (gi *gpuInstance) chooseCIStart(p *ciProfile) (uint32, bool) {
	used := gi.ciSpans()
	best, bestScore, ok := uint32(0), -1, false
	for _, s := range freeStarts(p.starts, p.slices, used) {
		after := append(append([]span(nil), used...), span{s, p.slices})
		score := 0
		for _, q := range gi.gpu.spec.mig.ciProfiles(gi.profile) {
			count := gi.ciCount(q.index)
			if q.index == p.index {
				count++
			}
			if count < q.instances {
				score += len(freeStarts(q.starts, q.slices, after))
			}
		}
		if score > bestScore {
			best, bestScore, ok = s, score, true
		}
	}
	return best, ok
}

// createCI implements CreateComputeInstance(WithPlacement); start nil lets NVML choose.
func (gi *gpuInstance) createCI(info *nvml.ComputeInstanceProfileInfo, start *uint32, size uint32) (*computeInstance, nvml.Return) {
	if info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	p := gi.gpu.spec.mig.ciProfile(gi.profile, int(info.Id))
	if p == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if gi.ciCount(p.index) >= p.instances {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	var s uint32
	if start != nil {
		if size != p.slices || !containsStart(p.starts, *start) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if !free(span{*start, p.slices}, gi.ciSpans()) {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		s = *start
	} else {
		var ok bool
		if s, ok = gi.chooseCIStart(p); !ok {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	}
	id := uint32(0)
	for gi.computeInstances[id] != nil {
		id++
	}
	ci := gi.addCI(id, p, s)
	g := gi.gpu
	if ret := g.m.commit(func() { ci.remove() }); ret != nvml.SUCCESS {
		return nil, ret
	}
	g.m.deliverLocked(g.index, nvml.EventMigConfigChange, 0, noInstance, noInstance)
	return ci, nvml.SUCCESS
}

// addCI records a compute instance and builds its handles.
func (gi *gpuInstance) addCI(id uint32, p *ciProfile, start uint32) *computeInstance {
	ci := &computeInstance{gi: gi, id: id, profile: p, start: start, uuid: migUUID(gi.gpu.uuid, gi.id, id)}
	ci.handle = ci.newHandle()
	ci.migDevice = ci.newMigDevice()
	gi.computeInstances[id] = ci
	return ci
}

func (ci *computeInstance) remove() {
	ci.destroyed = true
	delete(ci.gi.computeInstances, ci.id)
}

// destroyCI implements ComputeInstance.Destroy.
func (ci *computeInstance) destroyCI() nvml.Return {
	ci.remove()
	g := ci.gi.gpu
	if ret := g.m.commit(func() { ci.destroyed = false; ci.gi.computeInstances[ci.id] = ci }); ret != nvml.SUCCESS {
		return ret
	}
	g.m.deliverLocked(g.index, nvml.EventMigConfigChange, 0, noInstance, noInstance)
	return nvml.SUCCESS
}
