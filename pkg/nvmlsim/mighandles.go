package nvmlsim

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// The NVML handles of MIG: the GPU's GPU-instance methods, GpuInstance, ComputeInstance and the
// MIG device (an nvml.Device for one compute instance).

// handleGuard is deviceGuard plus a liveness check: handles of destroyed instances fail with
// ERROR_INVALID_ARGUMENT, as stale NVML handles do.
func (m *Machine) handleGuard(index int, prefix string, alive func() bool) guard {
	base := m.deviceGuard(index, prefix)
	return func(method string) (nvml.Return, bool) {
		if ret, fail := base(method); fail {
			return ret, true
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if !alive() {
			return nvml.ERROR_INVALID_ARGUMENT, true
		}
		return nvml.SUCCESS, false
	}
}

// setMigFuncs sets the MIG methods of a whole-GPU handle.
func (g *gpu) setMigFuncs(d *mock.Device) {
	if g.spec.mig == nil {
		return // L4: every MIG method keeps the default ERROR_NOT_SUPPORTED
	}
	table := g.spec.mig
	d.GetMigModeFunc = func() (current, pending int, ret nvml.Return) {
		g.locked(func() { current, pending = g.migCurrent, g.migPending })
		return current, pending, nvml.SUCCESS
	}
	d.SetMigModeFunc = func(mode int) (status, ret nvml.Return) {
		g.locked(func() { status, ret = g.setMigMode(mode) })
		return status, ret
	}
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(index int) (dev nvml.Device, ret nvml.Return) {
		if index < 0 {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		g.locked(func() {
			cis := g.computeInstances()
			if !g.migEnabled() || index >= len(cis) {
				dev, ret = nil, nvml.ERROR_NOT_FOUND
				return
			}
			dev, ret = cis[index].migDevice, nvml.SUCCESS
		})
		return dev, ret
	}
	d.GetGpuInstanceProfileInfoFunc = func(index int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		if index < 0 || index >= nvml.GPU_INSTANCE_PROFILE_COUNT {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		p := table.byIndex(index)
		if p == nil {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return p.info(), nvml.SUCCESS
	}
	d.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		if info == nil || table.byID(info.Id) == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		p := table.byID(info.Id)
		out := make([]nvml.GpuInstancePlacement, 0, len(p.starts))
		for _, s := range p.starts {
			out = append(out, nvml.GpuInstancePlacement{Start: s, Size: p.size})
		}
		return out, nvml.SUCCESS
	}
	d.GetGpuInstanceRemainingCapacityFunc = func(info *nvml.GpuInstanceProfileInfo) (n int, ret nvml.Return) {
		if info == nil || table.byID(info.Id) == nil {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		g.locked(func() { n = int(g.giRemaining(table.byID(info.Id))) })
		return n, nvml.SUCCESS
	}
	d.CreateGpuInstanceFunc = func(info *nvml.GpuInstanceProfileInfo) (gi nvml.GpuInstance, ret nvml.Return) {
		g.locked(func() { gi, ret = giHandle(g.createGI(info, nil, 0)) })
		return gi, ret
	}
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (gi nvml.GpuInstance, ret nvml.Return) {
		if pl == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		g.locked(func() { gi, ret = giHandle(g.createGI(info, &pl.Start, pl.Size)) })
		return gi, ret
	}
	d.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) (out []nvml.GpuInstance, ret nvml.Return) {
		if info == nil || table.byID(info.Id) == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		g.locked(func() {
			if !g.migEnabled() {
				ret = nvml.ERROR_NOT_SUPPORTED
				return
			}
			for _, gi := range g.sortedGpuInstances() {
				if gi.profile.id == info.Id {
					out = append(out, gi.handle)
				}
			}
			ret = nvml.SUCCESS
		})
		return out, ret
	}
	d.GetGpuInstanceByIdFunc = func(id int) (gi nvml.GpuInstance, ret nvml.Return) {
		g.locked(func() {
			switch {
			case !g.migEnabled():
				ret = nvml.ERROR_NOT_SUPPORTED
			case id < 0 || g.gpuInstances[uint32(id)] == nil:
				ret = nvml.ERROR_NOT_FOUND
			default:
				gi, ret = g.gpuInstances[uint32(id)].handle, nvml.SUCCESS
			}
		})
		return gi, ret
	}
}

// giHandle converts createGI's result, keeping a nil interface on failure.
func giHandle(gi *gpuInstance, ret nvml.Return) (nvml.GpuInstance, nvml.Return) {
	if gi == nil {
		return nil, ret
	}
	return gi.handle, ret
}

func (gi *gpuInstance) info() nvml.GpuInstanceInfo {
	return nvml.GpuInstanceInfo{
		Device:    gi.gpu.handle,
		Id:        gi.id,
		ProfileId: gi.profile.id,
		Placement: nvml.GpuInstancePlacement{Start: gi.start, Size: gi.profile.size},
	}
}

func (gi *gpuInstance) newHandle() *mock.GpuInstance {
	g := gi.gpu
	table := g.spec.mig
	h := &mock.GpuInstance{}
	h.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) { return gi.info(), nvml.SUCCESS }
	h.GetComputeInstanceProfileInfoFunc = func(index, engine int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		if index < 0 || index >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT || engine != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		p := table.ciProfile(gi.profile, index)
		if p == nil {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return p.info(), nvml.SUCCESS
	}
	profileOf := func(info *nvml.ComputeInstanceProfileInfo) *ciProfile {
		if info == nil {
			return nil
		}
		return table.ciProfile(gi.profile, int(info.Id))
	}
	h.GetComputeInstancePossiblePlacementsFunc = func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstancePlacement, nvml.Return) {
		p := profileOf(info)
		if p == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		out := make([]nvml.ComputeInstancePlacement, 0, len(p.starts))
		for _, s := range p.starts {
			out = append(out, nvml.ComputeInstancePlacement{Start: s, Size: p.slices})
		}
		return out, nvml.SUCCESS
	}
	h.GetComputeInstanceRemainingCapacityFunc = func(info *nvml.ComputeInstanceProfileInfo) (n int, ret nvml.Return) {
		p := profileOf(info)
		if p == nil {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		g.locked(func() { n = int(gi.ciRemaining(p)) })
		return n, nvml.SUCCESS
	}
	h.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (ci nvml.ComputeInstance, ret nvml.Return) {
		g.locked(func() { ci, ret = ciHandle(gi.createCI(info, nil, 0)) })
		return ci, ret
	}
	h.CreateComputeInstanceWithPlacementFunc = func(info *nvml.ComputeInstanceProfileInfo, pl *nvml.ComputeInstancePlacement) (ci nvml.ComputeInstance, ret nvml.Return) {
		if pl == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		g.locked(func() { ci, ret = ciHandle(gi.createCI(info, &pl.Start, pl.Size)) })
		return ci, ret
	}
	h.GetComputeInstancesFunc = func(info *nvml.ComputeInstanceProfileInfo) (out []nvml.ComputeInstance, ret nvml.Return) {
		if profileOf(info) == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		g.locked(func() {
			for _, ci := range gi.sortedComputeInstances() {
				if uint32(ci.profile.index) == info.Id {
					out = append(out, ci.handle)
				}
			}
		})
		return out, nvml.SUCCESS
	}
	h.GetComputeInstanceByIdFunc = func(id int) (ci nvml.ComputeInstance, ret nvml.Return) {
		g.locked(func() {
			if id < 0 || gi.computeInstances[uint32(id)] == nil {
				ret = nvml.ERROR_NOT_FOUND
				return
			}
			ci, ret = gi.computeInstances[uint32(id)].handle, nvml.SUCCESS
		})
		return ci, ret
	}
	h.DestroyFunc = func() (ret nvml.Return) {
		g.locked(func() { ret = gi.destroyGI() })
		return ret
	}
	finishMock(h, "GpuInstance", g.m.handleGuard(g.index, "GpuInstance.", func() bool { return !gi.destroyed }))
	return h
}

func ciHandle(ci *computeInstance, ret nvml.Return) (nvml.ComputeInstance, nvml.Return) {
	if ci == nil {
		return nil, ret
	}
	return ci.handle, ret
}

func (ci *computeInstance) newHandle() *mock.ComputeInstance {
	g := ci.gi.gpu
	h := &mock.ComputeInstance{}
	h.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) {
		return nvml.ComputeInstanceInfo{
			Device:      g.handle,
			GpuInstance: ci.gi.handle,
			Id:          ci.id,
			ProfileId:   uint32(ci.profile.index),
			Placement:   nvml.ComputeInstancePlacement{Start: ci.start, Size: ci.profile.slices},
		}, nvml.SUCCESS
	}
	h.DestroyFunc = func() (ret nvml.Return) {
		g.locked(func() { ret = ci.destroyCI() })
		return ret
	}
	finishMock(h, "ComputeInstance", g.m.handleGuard(g.index, "ComputeInstance.", func() bool { return !ci.destroyed }))
	return h
}

// newMigDevice builds the nvml.Device of the MIG device formed by compute instance ci. It answers
// identity, memory and attributes itself and the PCI and architecture questions with its parent's
// answers; the rest (telemetry, MIG management, index and minor number) is ERROR_NOT_SUPPORTED.
// ASSUMED: GetIndex and GetMinorNumber are not supported on MIG handles; use the parent's.
func (ci *computeInstance) newMigDevice() *mock.Device {
	gi := ci.gi
	g := gi.gpu
	parent := g.handle
	d := &mock.Device{}
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return true, nvml.SUCCESS }
	d.GetDeviceHandleFromMigDeviceHandleFunc = func() (nvml.Device, nvml.Return) { return parent, nvml.SUCCESS }
	d.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return int(gi.id), nvml.SUCCESS }
	d.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return int(ci.id), nvml.SUCCESS }
	d.GetUUIDFunc = func() (string, nvml.Return) { return ci.uuid, nvml.SUCCESS }
	d.GetNameFunc = func() (string, nvml.Return) { return g.spec.name + " MIG " + ci.profile.name, nvml.SUCCESS }
	used := func() (mem uint64) {
		g.locked(func() { _, mem = usage(ci.processesLocked()) })
		return mem
	}
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		total, used := gi.profile.memoryMiB<<20, used()
		return nvml.Memory{Total: total, Used: used, Free: total - used}, nvml.SUCCESS
	}
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) {
		total, used := gi.profile.memoryMiB<<20, used()
		return nvml.Memory_v2{Version: nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2), Total: total, Used: used, Free: total - used}, nvml.SUCCESS
	}
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{
			MultiprocessorCount:       ci.profile.sms,
			SharedCopyEngineCount:     gi.profile.copyEngines,
			SharedDecoderCount:        gi.profile.decoders,
			SharedEncoderCount:        gi.profile.encoders,
			SharedJpegCount:           gi.profile.jpegs,
			SharedOfaCount:            gi.profile.ofas,
			GpuInstanceSliceCount:     gi.profile.slices,
			ComputeInstanceSliceCount: ci.profile.slices,
			MemorySizeMB:              gi.profile.memoryMiB,
		}, nvml.SUCCESS
	}
	ci.setProcessFuncs(d)
	// The parent's answers, computed directly: calling the parent's (guarded) methods would apply
	// an injected error twice.
	s := g.spec
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		return pciInfo(0, g.m.spec.buses[g.index], s.pciDeviceID, s.pciSubsystemID), nvml.SUCCESS
	}
	d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return s.brand, nvml.SUCCESS }
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return s.arch, nvml.SUCCESS }
	d.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return s.ccMajor, s.ccMinor, nvml.SUCCESS }
	finishMock(d, "Device", g.m.handleGuard(g.index, "", func() bool { return !ci.destroyed }))
	return d
}
