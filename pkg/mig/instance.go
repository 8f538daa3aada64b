package mig

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Instance is a GPU instance and its compute instances.
type Instance struct {
	// GPUUUID is the UUID of the physical GPU.
	GPUUUID string
	// GIID is the NVML GPU-instance ID.
	GIID uint32
	// Profile is the GPU instance's profile.
	Profile Profile
	// Placement is where the GPU instance sits, in memory slices.
	Placement Placement
	// ComputeInstances are the GPU instance's compute instances, ordered by ID; empty for a GPU
	// instance left without one (by a crash, or by an administrator).
	ComputeInstances []ComputeInstance
	// CIID and UUID are those of the full compute instance (the one spanning all compute slices,
	// the MIG device this package creates) when the GPU instance has one; see Complete.
	CIID uint32
	UUID string
	// Adopted is set by Create when the GPU instance existed before the call (a retry after a
	// crash, or an instance created out of band); false when Create made it.
	Adopted bool
}

// ComputeInstance is a compute instance and the MIG device it forms.
type ComputeInstance struct {
	// ID is the NVML compute-instance ID within its GPU instance.
	ID uint32
	// ProfileID is the NVML compute-instance profile ID.
	ProfileID uint32
	// ComputeSlices is the number of compute slices of the compute instance.
	ComputeSlices int
	// Placement is where it sits in its GPU instance, in compute slices.
	Placement Placement
	// UUID is the MIG device's UUID ("MIG-..."); empty if NVML lists no MIG device for it.
	UUID string
}

// DeviceID identifies a MIG device independently of device minors and NVML's enumeration index of
// MIG devices, which change with MIG mode and with other instances: the parent GPU's UUID and the
// GPU- and compute-instance IDs.
type DeviceID struct {
	GPUUUID string
	GIID    uint32
	CIID    uint32
}

// String formats d as "<GPU UUID>/gi<GI>/ci<CI>".
func (d DeviceID) String() string {
	return fmt.Sprintf("%s/gi%d/ci%d", d.GPUUUID, d.GIID, d.CIID)
}

// Full returns the compute instance spanning the whole GPU instance, if there is one.
func (i *Instance) Full() (ComputeInstance, bool) {
	for _, ci := range i.ComputeInstances {
		if ci.ComputeSlices == i.Profile.ComputeSlices {
			return ci, true
		}
	}
	return ComputeInstance{}, false
}

// Complete reports whether the GPU instance has its full compute instance and that one's MIG
// device UUID: whether it is a usable MIG device as Create makes them.
func (i *Instance) Complete() bool {
	ci, ok := i.Full()
	return ok && ci.UUID != ""
}

// DeviceID returns the identity of the MIG device of compute instance ciID.
func (i *Instance) DeviceID(ciID uint32) DeviceID {
	return DeviceID{GPUUUID: i.GPUUUID, GIID: i.GIID, CIID: ciID}
}

// String describes the instance for logs and errors: "GI 3 (3g.40gb at 4:4)".
func (i *Instance) String() string {
	return fmt.Sprintf("GI %d (%s at %s)", i.GIID, i.Profile.Name, i.Placement)
}

// Instances lists dev's GPU instances, ordered by GPU-instance ID, with their compute instances
// and MIG device UUIDs. It returns nothing for a GPU whose MIG mode is off or that is not MIG
// capable.
func Instances(dev nvml.Device) ([]Instance, error) {
	uuid, err := gpuUUID(dev)
	if err != nil {
		return nil, err
	}
	enabled, err := migEnabled(dev, uuid)
	if err != nil || !enabled {
		return nil, ignoreNotCapable(err)
	}
	entries, err := readProfiles(dev, uuid)
	if err != nil {
		return nil, err
	}
	return listInstances(dev, uuid, entries)
}

// Find returns the GPU instance of profile profileID at placement, or nil if there is none. The
// prepare path uses it to find what an interrupted Create may have left, knowing only what it
// recorded before (profile and placement, not the IDs).
func Find(dev nvml.Device, profileID uint32, placement Placement) (*Instance, error) {
	instances, err := Instances(dev)
	if err != nil {
		return nil, err
	}
	return findInstance(instances, profileID, placement), nil
}

func findInstance(instances []Instance, profileID uint32, placement Placement) *Instance {
	for i := range instances {
		if instances[i].Profile.ID == profileID && instances[i].Placement == placement {
			return &instances[i]
		}
	}
	return nil
}

// migEnabled reports whether MIG mode is currently on; ErrNotCapable for GPUs without MIG.
func migEnabled(dev nvml.Device, uuid string) (bool, error) {
	current, _, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		return current == nvml.DEVICE_MIG_ENABLE, nil
	case nvml.ERROR_NOT_SUPPORTED:
		return false, fmt.Errorf("%s: %w: %w", uuid, ErrNotCapable, ret)
	default:
		return false, fmt.Errorf("get MIG mode of %s: %w", uuid, ret)
	}
}

func ignoreNotCapable(err error) error {
	if errors.Is(err, ErrNotCapable) {
		return nil
	}
	return err
}

// listInstances lists the GPU instances of every profile in entries.
func listInstances(dev nvml.Device, uuid string, entries []profileEntry) ([]Instance, error) {
	migUUIDs, err := migDeviceUUIDs(dev, uuid)
	if err != nil {
		return nil, err
	}
	var out []Instance
	for _, e := range entries {
		gis, ret := dev.GetGpuInstances(&e.info)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			return nil, nil // MIG mode is off: no instances
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("list GPU instances of profile %s on %s: %w", e.profile.Name, uuid, ret)
		}
		for _, gi := range gis {
			inst, err := describeInstance(gi, e.profile, uuid, migUUIDs)
			if err != nil {
				return nil, err
			}
			out = append(out, inst)
		}
	}
	slices.SortFunc(out, func(a, b Instance) int { return cmp.Compare(a.GIID, b.GIID) })
	return out, nil
}

// describeInstance reads a GPU instance and its compute instances.
func describeInstance(gi nvml.GpuInstance, profile Profile, uuid string, migUUIDs map[[2]uint32]string) (Instance, error) {
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("get info of a %s GPU instance on %s: %w", profile.Name, uuid, ret)
	}
	inst := Instance{
		GPUUUID:   uuid,
		GIID:      info.Id,
		Profile:   profile,
		Placement: Placement{Start: info.Placement.Start, Size: info.Placement.Size},
	}
	for index := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		ciProfile, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if unsupported(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return Instance{}, fmt.Errorf("get compute instance profile %d of %s on %s: %w", index, &inst, uuid, ret)
		}
		cis, ret := gi.GetComputeInstances(&ciProfile)
		if ret != nvml.SUCCESS {
			return Instance{}, fmt.Errorf("list compute instances of %s on %s: %w", &inst, uuid, ret)
		}
		for _, ci := range cis {
			ciInfo, ret := ci.GetInfo()
			if ret != nvml.SUCCESS {
				return Instance{}, fmt.Errorf("get info of a compute instance of %s on %s: %w", &inst, uuid, ret)
			}
			if slices.ContainsFunc(inst.ComputeInstances, func(c ComputeInstance) bool { return c.ID == ciInfo.Id }) {
				continue
			}
			inst.ComputeInstances = append(inst.ComputeInstances, ComputeInstance{
				ID:            ciInfo.Id,
				ProfileID:     ciInfo.ProfileId,
				ComputeSlices: int(ciProfile.SliceCount),
				Placement:     Placement{Start: ciInfo.Placement.Start, Size: ciInfo.Placement.Size},
				UUID:          migUUIDs[[2]uint32{info.Id, ciInfo.Id}],
			})
		}
	}
	slices.SortFunc(inst.ComputeInstances, func(a, b ComputeInstance) int { return cmp.Compare(a.ID, b.ID) })
	if ci, ok := inst.Full(); ok {
		inst.CIID, inst.UUID = ci.ID, ci.UUID
	}
	return inst, nil
}

// migDeviceUUIDs maps (GI ID, CI ID) to MIG device UUIDs, walking NVML's MIG device handles.
func migDeviceUUIDs(dev nvml.Device, uuid string) (map[[2]uint32]string, error) {
	count, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get MIG device count of %s: %w", uuid, ret)
	}
	out := map[[2]uint32]string{}
	for i := range count {
		mig, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // no MIG device at this index
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("get MIG device %d of %s: %w", i, uuid, ret)
		}
		giID, ret := mig.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("get GPU instance ID of MIG device %d of %s: %w", i, uuid, ret)
		}
		ciID, ret := mig.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("get compute instance ID of MIG device %d of %s: %w", i, uuid, ret)
		}
		migUUID, ret := mig.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("get UUID of MIG device %d of %s: %w", i, uuid, ret)
		}
		out[[2]uint32{uint32(giID), uint32(ciID)}] = migUUID
	}
	return out, nil
}
