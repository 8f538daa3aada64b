package mig

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2"
)

// Create makes sure dev has a MIG device of GPU-instance profile profileID at placement: a GPU
// instance created at exactly that placement plus the compute instance spanning it. It enables
// MIG mode first if it is off (see the package documentation for when that needs a GPU reset).
//
// Create is idempotent. If a GPU instance of that profile at that placement already exists, it is
// adopted (Instance.Adopted): returned as is when it has its full compute instance, completed with
// one when it has none (what a crash between the two creations leaves), and refused with
// ErrPlacementInUse when it has other compute instances. If the compute instance cannot be
// created, a GPU instance this call created is destroyed again; an adopted one is left alone.
//
// The returned Instance has the full compute instance's ID (CIID) and MIG device UUID (UUID).
// Errors name the GPU, profile and placement and wrap one of this package's errors
// (ErrUnknownProfile, ErrInvalidPlacement, ErrPlacementInUse, ErrGPUInUse, ErrResetRequired,
// ErrNotCapable) and/or the nvml.Return.
func Create(ctx context.Context, dev nvml.Device, profileID uint32, placement Placement) (*Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	uuid, err := gpuUUID(dev)
	if err != nil {
		return nil, err
	}
	entries, err := readProfiles(dev, uuid)
	if err != nil {
		return nil, fmt.Errorf("create MIG device with profile ID %d at %s: %w", profileID, placement, err)
	}
	e, ok := profileByID(entries, profileID)
	if !ok {
		return nil, fmt.Errorf("create MIG device on %s: %w: ID %d is not one of %s",
			uuid, ErrUnknownProfile, profileID, profileIDs(entries))
	}
	what := fmt.Sprintf("%s MIG device at %s on %s", e.profile.Name, placement, uuid)
	if !slices.Contains(e.profile.Placements, placement) {
		return nil, fmt.Errorf("create %s: %w: %s takes placements %s", what, ErrInvalidPlacement,
			e.profile.Name, placements(e.profile.Placements))
	}
	if err := enableMIG(ctx, dev, uuid); err != nil {
		// err names the GPU.
		return nil, fmt.Errorf("create %s MIG device at %s: %w", e.profile.Name, placement, err)
	}

	existing, err := listInstances(dev, uuid, entries)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", what, err)
	}
	if inst := findInstance(existing, profileID, placement); inst != nil {
		return adopt(ctx, dev, inst, what)
	}
	for i := range existing {
		if existing[i].Placement.Overlaps(placement) {
			return nil, fmt.Errorf("create %s: %w: it overlaps %s", what, ErrPlacementInUse, &existing[i])
		}
	}

	logger.V(4).Info("Creating GPU instance", "gpu", uuid, "profile", e.profile.Name, "profileID", profileID, "placement", placement)
	gi, ret := dev.CreateGpuInstanceWithPlacement(&e.info, &nvml.GpuInstancePlacement{Start: placement.Start, Size: placement.Size})
	if ret != nvml.SUCCESS {
		hint := ""
		if ret == nvml.ERROR_INSUFFICIENT_RESOURCES {
			hint = fmt.Sprintf(" (at most %d %s instances fit, and their engines must be free)", e.profile.MaxInstances, e.profile.Name)
		}
		return nil, fmt.Errorf("create GPU instance for %s%s: %w", what, hint, ret)
	}
	inst, err := complete(ctx, dev, gi, e.profile, uuid, what)
	if err != nil {
		if derr := destroyGPUInstance(ctx, gi, uuid, what); derr != nil {
			return nil, errors.Join(err, fmt.Errorf("roll back: %w", derr))
		}
		return nil, err
	}
	logger.V(4).Info("Created MIG device", "gpu", uuid, "profile", e.profile.Name, "placement", placement,
		"gi", inst.GIID, "ci", inst.CIID, "uuid", inst.UUID)
	return inst, nil
}

// adopt returns an existing GPU instance, completing it with its full compute instance if it has
// none.
func adopt(ctx context.Context, dev nvml.Device, inst *Instance, what string) (*Instance, error) {
	logger := klog.FromContext(ctx)
	inst.Adopted = true
	if inst.Complete() {
		logger.V(4).Info("Adopting existing MIG device", "gpu", inst.GPUUUID, "profile", inst.Profile.Name,
			"placement", inst.Placement, "gi", inst.GIID, "ci", inst.CIID, "uuid", inst.UUID)
		return inst, nil
	}
	if len(inst.ComputeInstances) > 0 {
		var ids []string
		for _, ci := range inst.ComputeInstances {
			ids = append(ids, fmt.Sprintf("%d (%d compute slices, MIG device %q)", ci.ID, ci.ComputeSlices, ci.UUID))
		}
		return nil, fmt.Errorf("create %s: %w: %s exists with compute instances %s instead of one spanning it",
			what, ErrPlacementInUse, inst, strings.Join(ids, ", "))
	}
	logger.V(4).Info("Completing GPU instance without compute instance", "gpu", inst.GPUUUID,
		"profile", inst.Profile.Name, "placement", inst.Placement, "gi", inst.GIID)
	gi, ret := dev.GetGpuInstanceById(int(inst.GIID))
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("create %s: get %s: %w", what, inst, ret)
	}
	done, err := complete(ctx, dev, gi, inst.Profile, inst.GPUUUID, what)
	if err != nil {
		return nil, err
	}
	done.Adopted = true
	return done, nil
}

// complete creates the full compute instance of gi and returns the resulting MIG device. On
// failure it leaves gi as it found it (without compute instance).
func complete(ctx context.Context, dev nvml.Device, gi nvml.GpuInstance, profile Profile, uuid, what string) (*Instance, error) {
	logger := klog.FromContext(ctx)
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("create %s: get GPU instance info: %w", what, ret)
	}
	inst := &Instance{
		GPUUUID:   uuid,
		GIID:      giInfo.Id,
		Profile:   profile,
		Placement: Placement{Start: giInfo.Placement.Start, Size: giInfo.Placement.Size},
	}
	ciProfile, err := fullComputeProfile(gi, profile)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", what, err)
	}
	logger.V(4).Info("Creating compute instance", "gpu", uuid, "profile", profile.Name, "placement", inst.Placement,
		"gi", inst.GIID, "ciProfileID", ciProfile.Id)
	ci, ret := gi.CreateComputeInstance(&ciProfile)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("create compute instance for %s (GI %d): %w", what, inst.GIID, ret)
	}
	ciInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		err := fmt.Errorf("create %s: get compute instance info: %w", what, ret)
		return nil, withUndo(ctx, err, ci, uuid, inst)
	}
	uuids, err := migDeviceUUIDs(dev, uuid)
	if err != nil {
		return nil, withUndo(ctx, fmt.Errorf("create %s: %w", what, err), ci, uuid, inst)
	}
	migUUID := uuids[[2]uint32{inst.GIID, ciInfo.Id}]
	if migUUID == "" {
		err := fmt.Errorf("create %s: NVML lists no MIG device for GI %d CI %d", what, inst.GIID, ciInfo.Id)
		return nil, withUndo(ctx, err, ci, uuid, inst)
	}
	full := ComputeInstance{
		ID:            ciInfo.Id,
		ProfileID:     ciInfo.ProfileId,
		ComputeSlices: int(ciProfile.SliceCount),
		Placement:     Placement{Start: ciInfo.Placement.Start, Size: ciInfo.Placement.Size},
		UUID:          migUUID,
	}
	inst.ComputeInstances = []ComputeInstance{full}
	inst.CIID, inst.UUID = full.ID, full.UUID
	return inst, nil
}

// withUndo destroys a compute instance complete just created, adding any failure to err.
func withUndo(ctx context.Context, err error, ci nvml.ComputeInstance, uuid string, inst *Instance) error {
	klog.FromContext(ctx).V(4).Info("Destroying compute instance after failure", "gpu", uuid,
		"profile", inst.Profile.Name, "placement", inst.Placement, "gi", inst.GIID, "err", err)
	if ret := ci.Destroy(); ret != nvml.SUCCESS && !gone(ret) {
		return errors.Join(err, fmt.Errorf("roll back: destroy compute instance of %s on %s: %w", inst, uuid, ret))
	}
	return err
}

// fullComputeProfile returns the compute-instance profile spanning all of the GPU instance's
// compute slices, normally COMPUTE_INSTANCE_PROFILE_<n>_SLICE: the first such by NVML index.
func fullComputeProfile(gi nvml.GpuInstance, profile Profile) (nvml.ComputeInstanceProfileInfo, error) {
	for index := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if unsupported(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return info, fmt.Errorf("get compute instance profile %d: %w", index, ret)
		}
		if int(info.SliceCount) == profile.ComputeSlices {
			return info, nil
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, fmt.Errorf("no compute instance profile spans the %d compute slices of %s",
		profile.ComputeSlices, profile.Name)
}

// destroyGPUInstance destroys a GPU instance Create just made, rolling it back.
func destroyGPUInstance(ctx context.Context, gi nvml.GpuInstance, uuid, what string) error {
	klog.FromContext(ctx).V(4).Info("Destroying GPU instance after failure", "gpu", uuid, "device", what)
	if ret := gi.Destroy(); ret != nvml.SUCCESS && !gone(ret) {
		return fmt.Errorf("destroy GPU instance of %s: %w", what, ret)
	}
	return nil
}

// Destroy removes compute instance ciID and then GPU instance giID from dev. Instances already
// gone count as destroyed, so Destroy can be repeated after a crash. Compute instances of the GPU
// instance other than ciID are not touched: if there are any, destroying the GPU instance fails
// with nvml.ERROR_IN_USE, naming them.
func Destroy(ctx context.Context, dev nvml.Device, giID, ciID uint32) error {
	logger := klog.FromContext(ctx)
	uuid, err := gpuUUID(dev)
	if err != nil {
		return err
	}
	gi, ret := dev.GetGpuInstanceById(int(giID))
	if gone(ret) {
		logger.V(5).Info("GPU instance already gone", "gpu", uuid, "gi", giID, "ret", ret)
		return nil
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("destroy MIG device GI %d CI %d on %s: get GPU instance: %w", giID, ciID, uuid, ret)
	}
	what := fmt.Sprintf("GI %d on %s", giID, uuid)
	if info, ret := gi.GetInfo(); ret == nvml.SUCCESS {
		what = fmt.Sprintf("GI %d (profile ID %d at %s) on %s", giID, info.ProfileId,
			Placement{Start: info.Placement.Start, Size: info.Placement.Size}, uuid)
	}

	ci, ret := gi.GetComputeInstanceById(int(ciID))
	switch {
	case ret == nvml.SUCCESS:
		logger.V(4).Info("Destroying compute instance", "gpu", uuid, "gi", giID, "ci", ciID)
		if ret := ci.Destroy(); ret != nvml.SUCCESS && !gone(ret) {
			return fmt.Errorf("destroy compute instance %d of %s: %w", ciID, what, ret)
		}
	case gone(ret):
		logger.V(5).Info("Compute instance already gone", "gpu", uuid, "gi", giID, "ci", ciID, "ret", ret)
	default:
		return fmt.Errorf("destroy compute instance %d of %s: get it: %w", ciID, what, ret)
	}

	logger.V(4).Info("Destroying GPU instance", "gpu", uuid, "gi", giID)
	ret = gi.Destroy()
	switch {
	case ret == nvml.SUCCESS || gone(ret):
		return nil
	case ret == nvml.ERROR_IN_USE:
		return fmt.Errorf("destroy %s: it has compute instances %s besides %d: %w", what, otherComputeInstances(gi, ciID), ciID, ret)
	default:
		return fmt.Errorf("destroy %s: %w", what, ret)
	}
}

// otherComputeInstances lists the IDs of gi's compute instances for an error message.
func otherComputeInstances(gi nvml.GpuInstance, except uint32) string {
	var ids []string
	for index := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret != nvml.SUCCESS {
			continue
		}
		for _, ci := range cis {
			if ciInfo, ret := ci.GetInfo(); ret == nvml.SUCCESS && ciInfo.Id != except {
				ids = append(ids, fmt.Sprint(ciInfo.Id))
			}
		}
	}
	if len(ids) == 0 {
		return "(unknown)"
	}
	return "[" + strings.Join(ids, " ") + "]"
}

// DisableIfUnused turns MIG mode off on dev if no GPU instance is left, so that the whole GPU can
// be used again, and reports whether the current mode changed. A GPU without MIG support, or with
// MIG mode already off, is left alone (a pending enable that waits for a reset is cancelled). On
// GPUs that need a reset to change mode the error wraps ErrResetRequired and the GPU stays in MIG
// mode without instances.
func DisableIfUnused(ctx context.Context, dev nvml.Device) (bool, error) {
	logger := klog.FromContext(ctx)
	uuid, err := gpuUUID(dev)
	if err != nil {
		return false, err
	}
	current, pending, ret := dev.GetMigMode()
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED:
		return false, nil
	case ret != nvml.SUCCESS:
		return false, fmt.Errorf("disable MIG mode on %s: get MIG mode: %w", uuid, ret)
	case current == nvml.DEVICE_MIG_DISABLE:
		if pending == nvml.DEVICE_MIG_ENABLE {
			logger.V(4).Info("Cancelling pending MIG mode enable", "gpu", uuid)
			return false, setMigMode(dev, uuid, nvml.DEVICE_MIG_DISABLE)
		}
		return false, nil
	}
	instances, err := Instances(dev)
	if err != nil {
		return false, fmt.Errorf("disable MIG mode on %s: %w", uuid, err)
	}
	if len(instances) > 0 {
		logger.V(5).Info("Keeping MIG mode: GPU instances remain", "gpu", uuid, "instances", len(instances))
		return false, nil
	}
	logger.V(4).Info("Disabling MIG mode", "gpu", uuid)
	if err := setMigMode(dev, uuid, nvml.DEVICE_MIG_DISABLE); err != nil {
		return false, err
	}
	logger.V(4).Info("Disabled MIG mode", "gpu", uuid)
	return true, nil
}

// enableMIG turns MIG mode on, if it is off, on a GPU without processes.
func enableMIG(ctx context.Context, dev nvml.Device, uuid string) error {
	logger := klog.FromContext(ctx)
	current, pending, ret := dev.GetMigMode()
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED:
		return fmt.Errorf("%s: %w: %w", uuid, ErrNotCapable, ret)
	case ret != nvml.SUCCESS:
		return fmt.Errorf("get MIG mode of %s: %w", uuid, ret)
	case current == nvml.DEVICE_MIG_ENABLE && pending == nvml.DEVICE_MIG_DISABLE:
		// A disable waiting for a reset (A100) would destroy the instance about to be made.
		logger.V(4).Info("Cancelling pending MIG mode disable", "gpu", uuid)
		return setMigMode(dev, uuid, nvml.DEVICE_MIG_ENABLE)
	case current == nvml.DEVICE_MIG_ENABLE:
		return nil
	case pending == nvml.DEVICE_MIG_ENABLE:
		return fmt.Errorf("MIG mode of %s is pending enable: %w (reset the idle GPU with nvidia-smi -r, or reboot)", uuid, ErrResetRequired)
	}
	pids, err := runningProcesses(dev, uuid)
	if err != nil {
		return err
	}
	if len(pids) > 0 {
		return fmt.Errorf("enable MIG mode on %s: %w: processes %v run on it", uuid, ErrGPUInUse, pids)
	}
	logger.V(4).Info("Enabling MIG mode", "gpu", uuid)
	if err := setMigMode(dev, uuid, nvml.DEVICE_MIG_ENABLE); err != nil {
		return err
	}
	logger.V(4).Info("Enabled MIG mode", "gpu", uuid)
	return nil
}

// setMigMode sets MIG mode and checks that it is current, not just pending.
func setMigMode(dev nvml.Device, uuid string, mode int) error {
	verb := "enable"
	if mode == nvml.DEVICE_MIG_DISABLE {
		verb = "disable"
	}
	status, ret := dev.SetMigMode(mode)
	for _, r := range []nvml.Return{ret, status} {
		switch r {
		case nvml.SUCCESS:
		case nvml.ERROR_RESET_REQUIRED:
			return fmt.Errorf("%s MIG mode on %s: %w (reset the GPU with nvidia-smi -r, or reboot): %w", verb, uuid, ErrResetRequired, r)
		case nvml.ERROR_IN_USE:
			return fmt.Errorf("%s MIG mode on %s: %w (a process, daemon or GPU instance holds it): %w", verb, uuid, ErrGPUInUse, r)
		default:
			return fmt.Errorf("%s MIG mode on %s: %w", verb, uuid, r)
		}
	}
	current, pending, ret := dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("%s MIG mode on %s: read it back: %w", verb, uuid, ret)
	}
	if current != mode {
		return fmt.Errorf("%s MIG mode on %s: %w: current mode %s, pending %s (reset the idle GPU with nvidia-smi -r, or reboot)",
			verb, uuid, ErrResetRequired, modeName(current), modeName(pending))
	}
	return nil
}

func modeName(mode int) string {
	if mode == nvml.DEVICE_MIG_ENABLE {
		return "enabled"
	}
	return "disabled"
}

// runningProcesses lists the PIDs of compute and graphics processes on dev.
func runningProcesses(dev nvml.Device, uuid string) ([]uint32, error) {
	var pids []uint32
	for _, list := range []func() ([]nvml.ProcessInfo, nvml.Return){dev.GetComputeRunningProcesses, dev.GetGraphicsRunningProcesses} {
		procs, ret := list()
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("list processes on %s: %w", uuid, ret)
		}
		for _, p := range procs {
			if !slices.Contains(pids, p.Pid) {
				pids = append(pids, p.Pid)
			}
		}
	}
	return pids, nil
}

// profileIDs lists the profiles of entries for error messages: "19 (1g.10gb), 20 (1g.10gb+me)".
func profileIDs(entries []profileEntry) string {
	var parts []string
	for _, e := range entries {
		parts = append(parts, fmt.Sprintf("%d (%s)", e.profile.ID, e.profile.Name))
	}
	return strings.Join(parts, ", ")
}

// placements lists placements for error messages.
func placements(ps []Placement) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, p.String())
	}
	return strings.Join(parts, ", ")
}
