package mig

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Placement is where a GPU instance sits: the first memory slice and the number of memory slices
// it occupies, [Start, Start+Size), as NVML's GpuInstancePlacement. (For a compute instance it is
// in compute slices of its GPU instance.) It converts directly to checkpoint.MigPlacement.
type Placement struct {
	Start uint32
	Size  uint32
}

// String formats p like `nvidia-smi mig -lgi` does: "start:size".
func (p Placement) String() string {
	return fmt.Sprintf("%d:%d", p.Start, p.Size)
}

// Overlaps reports whether p and q share a slice.
func (p Placement) Overlaps(q Placement) bool {
	return p.Start < q.Start+q.Size && q.Start < p.Start+p.Size
}

// Profile is a GPU-instance profile as `nvidia-smi mig -lgip` and `-lgipp` show it.
type Profile struct {
	// Index is the NVML profile index (nvml.GPU_INSTANCE_PROFILE_*), the argument of
	// GetGpuInstanceProfileInfo.
	Index int
	// ID is the profile ID NVML reports (GpuInstanceProfileInfo.Id), nvidia-smi's "ID" column,
	// e.g. 19 for 1g.10gb on an H100. Create takes it.
	ID uint32
	// Name is nvidia-smi's name, e.g. "1g.10gb", "1g.10gb+me", "7g.80gb".
	Name string
	// ComputeSlices is the number of compute (SM) slices, the "g" in the name.
	ComputeSlices int
	// MemorySlices is the number of memory slices one placement occupies.
	MemorySlices int
	// MemoryBytes is the instance's memory.
	MemoryBytes     uint64
	Multiprocessors int
	CopyEngines     int
	Decoders        int
	Encoders        int
	JPEGs           int
	OFAs            int
	// MaxInstances is the most instances of this profile one GPU can hold.
	MaxInstances int
	// Placements are the possible placements, ordered by start.
	Placements []Placement
}

// Totals is what a MIG-capable GPU has to share between its GPU instances.
type Totals struct {
	// MemorySlices is the number of memory slices (8 on A100, H100, H200 and B200): the end of
	// the furthest placement.
	MemorySlices int
	// ComputeSlices is the number of compute slices (7 on those GPUs): the full profile's.
	ComputeSlices int
	// The rest are the full profile's (the one with the most compute and memory slices, e.g.
	// 7g.80gb): what is left of the GPU in MIG mode.
	MemoryBytes     uint64
	Multiprocessors int
	CopyEngines     int
	Decoders        int
	Encoders        int
	JPEGs           int
	OFAs            int
}

// Info is the MIG geometry and state of one GPU.
type Info struct {
	Totals
	// Profiles are the GPU's GPU-instance profiles, as Profiles returns them.
	Profiles []Profile
	// Instances are the GPU instances that exist, as Instances returns them.
	Instances []Instance
}

// profileEntry is a profile with the NVML info needed to create instances of it.
type profileEntry struct {
	info    nvml.GpuInstanceProfileInfo
	profile Profile
}

// Profiles returns every GPU-instance profile dev supports, with its possible placements, in
// nvidia-smi's order (by compute slices, then memory slices, then name). It works whether MIG mode
// is on or off; a GPU without MIG support gives an error wrapping ErrNotCapable.
func Profiles(dev nvml.Device) ([]Profile, error) {
	uuid, err := gpuUUID(dev)
	if err != nil {
		return nil, err
	}
	entries, err := readProfiles(dev, uuid)
	if err != nil {
		return nil, err
	}
	out := make([]Profile, len(entries))
	for i, e := range entries {
		out[i] = e.profile
	}
	return out, nil
}

// TotalsOf derives a GPU's totals from its profiles (zero Totals for none).
func TotalsOf(profiles []Profile) Totals {
	var t Totals
	var full *Profile
	for i := range profiles {
		p := &profiles[i]
		for _, pl := range p.Placements {
			t.MemorySlices = max(t.MemorySlices, int(pl.Start+pl.Size))
		}
		if full == nil || p.ComputeSlices > full.ComputeSlices ||
			(p.ComputeSlices == full.ComputeSlices && p.MemorySlices > full.MemorySlices) {
			full = p
		}
	}
	if full == nil {
		return t
	}
	t.ComputeSlices = full.ComputeSlices
	t.MemoryBytes = full.MemoryBytes
	// Variants of the full profile (e.g. +gfx) can differ in engines: take the most of each.
	for _, p := range profiles {
		if p.ComputeSlices != full.ComputeSlices || p.MemorySlices != full.MemorySlices {
			continue
		}
		t.Multiprocessors = max(t.Multiprocessors, p.Multiprocessors)
		t.CopyEngines = max(t.CopyEngines, p.CopyEngines)
		t.Decoders = max(t.Decoders, p.Decoders)
		t.Encoders = max(t.Encoders, p.Encoders)
		t.JPEGs = max(t.JPEGs, p.JPEGs)
		t.OFAs = max(t.OFAs, p.OFAs)
	}
	return t
}

// Describe returns dev's MIG geometry and instances, or nil for a GPU without MIG support. The
// device model publishes from it; Instances is empty while MIG mode is off.
func Describe(dev nvml.Device) (*Info, error) {
	uuid, err := gpuUUID(dev)
	if err != nil {
		return nil, err
	}
	enabled, err := migEnabled(dev, uuid)
	if errors.Is(err, ErrNotCapable) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	entries, err := readProfiles(dev, uuid)
	if err != nil {
		return nil, err
	}
	info := &Info{}
	for _, e := range entries {
		info.Profiles = append(info.Profiles, e.profile)
	}
	info.Totals = TotalsOf(info.Profiles)
	if enabled {
		if info.Instances, err = listInstances(dev, uuid, entries); err != nil {
			return nil, err
		}
	}
	return info, nil
}

// readProfiles enumerates dev's GPU-instance profiles by NVML profile index.
func readProfiles(dev nvml.Device, uuid string) ([]profileEntry, error) {
	if _, err := migEnabled(dev, uuid); err != nil {
		return nil, err
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get memory info of %s: %w", uuid, ret)
	}
	var entries []profileEntry
	for index := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		if unsupported(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("get GPU instance profile %d of %s: %w", index, uuid, ret)
		}
		if slices.ContainsFunc(entries, func(e profileEntry) bool { return e.info.Id == info.Id }) {
			continue
		}
		p := Profile{
			Index:           index,
			ID:              info.Id,
			Name:            profileName(index, info.SliceCount, info.MemorySizeMB, mem.Total),
			ComputeSlices:   int(info.SliceCount),
			MemoryBytes:     info.MemorySizeMB << 20,
			Multiprocessors: int(info.MultiprocessorCount),
			CopyEngines:     int(info.CopyEngineCount),
			Decoders:        int(info.DecoderCount),
			Encoders:        int(info.EncoderCount),
			JPEGs:           int(info.JpegCount),
			OFAs:            int(info.OfaCount),
			MaxInstances:    int(info.InstanceCount),
		}
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("get placements of MIG profile %s (ID %d) on %s: %w", p.Name, p.ID, uuid, ret)
		}
		for _, pl := range placements {
			p.Placements = append(p.Placements, Placement{Start: pl.Start, Size: pl.Size})
			p.MemorySlices = max(p.MemorySlices, int(pl.Size))
		}
		slices.SortFunc(p.Placements, func(a, b Placement) int { return cmp.Compare(a.Start, b.Start) })
		entries = append(entries, profileEntry{info: info, profile: p})
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("%s reports no GPU instance profiles: %w", uuid, ErrNotCapable)
	}
	slices.SortFunc(entries, func(a, b profileEntry) int {
		return cmp.Or(
			cmp.Compare(a.profile.ComputeSlices, b.profile.ComputeSlices),
			cmp.Compare(a.profile.MemorySlices, b.profile.MemorySlices),
			cmp.Compare(a.profile.Name, b.profile.Name),
			cmp.Compare(a.profile.ID, b.profile.ID),
		)
	})
	return entries, nil
}

// profileByID returns the entry of profile ID id.
func profileByID(entries []profileEntry, id uint32) (profileEntry, bool) {
	for _, e := range entries {
		if e.profile.ID == id {
			return e, true
		}
	}
	return profileEntry{}, false
}

// profileName is nvidia-smi's name of a GPU-instance profile.
func profileName(index int, computeSlices uint32, memoryMiB, gpuMemoryBytes uint64) string {
	return fmt.Sprintf("%dg.%dgb%s", computeSlices, memoryGB(memoryMiB, gpuMemoryBytes), nameSuffix(index))
}

// memoryGB is the memory figure of a profile name: the profile's share of the GPU's memory rounded
// up to eighths, times the GPU's memory in GiB rounded up, rounded half up. Plain rounding of the
// profile's own size does not give NVIDIA's names: 7g.80gb has 79.25 GiB, 1g.18gb 16 GiB.
func memoryGB(memoryMiB, gpuMemoryBytes uint64) uint64 {
	if gpuMemoryBytes == 0 {
		return (memoryMiB + 512) >> 10
	}
	eighths := ceilDiv(memoryMiB<<20*8, gpuMemoryBytes)
	gpuGiB := ceilDiv(gpuMemoryBytes, 1<<30)
	return (eighths*gpuGiB*2 + 8) / 16
}

func ceilDiv(a, b uint64) uint64 {
	return (a + b - 1) / b
}

// nameSuffix is the attribute suffix of a profile name, from the NVML profile index.
func nameSuffix(index int) string {
	switch index {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		return "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		return "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		return "-me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		return "+gfx"
	}
	return ""
}
