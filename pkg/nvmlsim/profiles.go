package nvmlsim

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MIG profile tables as the real GPUs report them.
//
// go-nvml's mock machines (v0.13.4-1) get these wrong: profile IDs 0-9 instead of NVML's IDs
// (19, 20, 15, 14, 9, 5, 0), 7 memory slices instead of 8, 1g.20gb with 7 one-slice placements
// instead of 4 two-slice ones, and too few decoders on the largest profile. The tables below
// follow `nvidia-smi mig -lgip` (profiles, engines, memory) and `nvidia-smi mig -lgipp`
// (placements) on the real GPUs. NVML numbers placements in memory slices: every GPU here has 8
// memory slices and 7 compute slices; a placement {start}:size occupies memory slices
// [start, start+size).
//
// Sources:
//   - A100-SXM4-40GB: NVIDIA MIG User Guide, "List GPU Instance Profiles" (-lgip and -lgipp
//     output on A100-SXM4-40GB) and its "Instance Geometry" examples.
//   - H100 80GB HBM3: `nvidia-smi mig -lgip` on an H100 80GB HBM3 (published field notes) and
//     `-lgipp` from the MIG User Guide (identical on H100 and H100 NVL); exact MiB values from a
//     driver-published ResourceSlice captured on a p5.48xlarge (they match the GiB columns:
//     9984 MiB = 9.75 GiB, 20096 = 19.62, 40448 = 39.50, 81152 = 79.25).
//   - H200 141GB: MIG User Guide table "GPU Instance Profiles on H200" (engines, copy engines,
//     instance counts, memory fractions) and a published `-lgip` excerpt for 1g.18gb (16.00 GiB,
//     16 SMs), 1g.18gb+me, 2g.35gb (32.50 GiB, 32 SMs) and 7g.141gb (140.00 GiB, 132 SMs).
//     ASSUMED where no public output was found: 1g.35gb has 2g.35gb's memory (as 1g.20gb has
//     2g.20gb's on H100) and H100's 26 SMs; 3g.71gb and 4g.71gb have 60 and 64 SMs (same GH100
//     die as H100) and 65.50 GiB (67072 MiB), twice 2g.35gb plus the 0.50 GiB step seen between
//     the 1g and 2g rows.
//   - B200: MIG User Guide table "GPU Instance Profiles on B200" (instance counts, fractions,
//     placements) and, for MiB, SMs and engines, a driver-published ResourceSlice captured on a
//     p6-b200.48xlarge. The guide lists 3 copy engines for 2g.45gb and 1 NVDEC/JPEG for every
//     profile; the captured values (4 CEs; 2, 3, 4 and 7 NVDEC/JPEG for 2g, 3g, 4g and 7g) come
//     from a running driver and are used here.
//
// Profile indexes are NVML's GPU_INSTANCE_PROFILE_* constants: the argument of
// GetGpuInstanceProfileInfo. "+me" profiles are GPU_INSTANCE_PROFILE_1_SLICE_REV1 (the index
// mig-parted names "+me"; "+me.all" is 1_SLICE_ALL_ME, which these GPUs do not have), and the
// two-memory-slice one-compute-slice profiles are GPU_INSTANCE_PROFILE_1_SLICE_REV2.

// memorySlices is the number of memory slices of every MIG-capable GPU simulated here.
const memorySlices = 8

// giProfile is one GPU-instance profile.
type giProfile struct {
	index       int    // NVML profile index, argument of GetGpuInstanceProfileInfo
	id          uint32 // profile ID NVML reports in GpuInstanceProfileInfo.Id
	name        string // e.g. "1g.10gb"
	slices      uint32 // compute slices (GpuInstanceProfileInfo.SliceCount)
	instances   uint32 // most instances of this profile on one GPU
	memoryMiB   uint64
	sms         uint32
	copyEngines uint32
	decoders    uint32
	encoders    uint32
	jpegs       uint32
	ofas        uint32
	size        uint32   // memory slices one placement occupies
	starts      []uint32 // valid placement starts, in memory slices
}

// migTable is the MIG profile table of one GPU model.
type migTable struct {
	profiles []giProfile
}

func seq(n uint32) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(i)
	}
	return s
}

// profile is a row of a table: engines are given as in the -lgip columns.
func profile(index int, id uint32, name string, slices, instances uint32, memoryMiB uint64,
	sms, dec, enc, ce, jpeg, ofa, size uint32, starts []uint32) giProfile {
	return giProfile{
		index: index, id: id, name: name, slices: slices, instances: instances,
		memoryMiB: memoryMiB, sms: sms, copyEngines: ce, decoders: dec, encoders: enc,
		jpegs: jpeg, ofas: ofa, size: size, starts: starts,
	}
}

var (
	oneSliceStarts = seq(7)
	twoSliceStarts = []uint32{0, 2, 4, 6}
	twoGStarts     = []uint32{0, 2, 4}
	threeGStarts   = []uint32{0, 4}
	zeroStart      = []uint32{0}
)

// Columns: index, ID, name, compute slices, instances, MiB, SM, DEC, ENC, CE, JPEG, OFA,
// placement size, placement starts.
var a100SXM440GB = &migTable{profiles: []giProfile{
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.5gb", 1, 7, 4864, 14, 0, 0, 1, 0, 0, 1, oneSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.5gb+me", 1, 1, 4864, 14, 1, 0, 1, 1, 1, 1, oneSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.10gb", 1, 4, 9856, 14, 1, 0, 1, 0, 0, 2, twoSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.10gb", 2, 3, 9856, 28, 1, 0, 2, 0, 0, 2, twoGStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.20gb", 3, 2, 19968, 42, 2, 0, 3, 0, 0, 4, threeGStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.20gb", 4, 1, 19968, 56, 2, 0, 4, 0, 0, 4, zeroStart),
	profile(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.40gb", 7, 1, 40192, 98, 5, 0, 7, 1, 1, 8, zeroStart),
}}

var h10080GB = &migTable{profiles: []giProfile{
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.10gb", 1, 7, 9984, 16, 1, 0, 1, 1, 0, 1, oneSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 9984, 16, 1, 0, 1, 1, 1, 1, oneSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.20gb", 1, 4, 20096, 26, 1, 0, 1, 1, 0, 2, twoSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.20gb", 2, 3, 20096, 32, 2, 0, 2, 2, 0, 2, twoGStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.40gb", 3, 2, 40448, 60, 3, 0, 3, 3, 0, 4, threeGStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.40gb", 4, 1, 40448, 64, 4, 0, 4, 4, 0, 4, zeroStart),
	profile(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.80gb", 7, 1, 81152, 132, 7, 0, 8, 7, 1, 8, zeroStart),
}}

var h200141GB = &migTable{profiles: []giProfile{
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.18gb", 1, 7, 16384, 16, 1, 0, 1, 1, 0, 1, oneSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.18gb+me", 1, 1, 16384, 16, 1, 0, 1, 1, 1, 1, oneSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.35gb", 1, 4, 33280, 26, 1, 0, 1, 1, 0, 2, twoSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.35gb", 2, 3, 33280, 32, 2, 0, 2, 2, 0, 2, twoGStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.71gb", 3, 2, 67072, 60, 3, 0, 3, 3, 0, 4, threeGStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.71gb", 4, 1, 67072, 64, 4, 0, 4, 4, 0, 4, zeroStart),
	profile(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.141gb", 7, 1, 143360, 132, 7, 0, 8, 7, 1, 8, zeroStart),
}}

var b200180GB = &migTable{profiles: []giProfile{
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, "1g.23gb", 1, 7, 20992, 18, 1, 0, 2, 1, 0, 1, oneSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, "1g.23gb+me", 1, 1, 20992, 18, 1, 0, 2, 1, 1, 1, oneSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, "1g.45gb", 1, 4, 45312, 30, 1, 0, 2, 1, 0, 2, twoSliceStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, "2g.45gb", 2, 3, 45312, 36, 2, 0, 4, 2, 0, 2, twoGStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, "3g.90gb", 3, 2, 91136, 70, 3, 0, 6, 3, 0, 4, threeGStarts),
	profile(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, "4g.90gb", 4, 1, 91136, 72, 4, 0, 8, 4, 0, 4, zeroStart),
	profile(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, "7g.180gb", 7, 1, 182784, 148, 7, 0, 16, 7, 1, 8, zeroStart),
}}

// byIndex returns the profile with NVML profile index i, or nil.
func (t *migTable) byIndex(i int) *giProfile {
	for k := range t.profiles {
		if t.profiles[k].index == i {
			return &t.profiles[k]
		}
	}
	return nil
}

// byID returns the profile NVML reports with ID id, or nil.
func (t *migTable) byID(id uint32) *giProfile {
	for k := range t.profiles {
		if t.profiles[k].id == id {
			return &t.profiles[k]
		}
	}
	return nil
}

// bySlices returns the plain (non-REV) profile with the given number of compute slices, or nil.
func (t *migTable) bySlices(slices uint32) *giProfile {
	index := map[uint32]int{
		1: nvml.GPU_INSTANCE_PROFILE_1_SLICE,
		2: nvml.GPU_INSTANCE_PROFILE_2_SLICE,
		3: nvml.GPU_INSTANCE_PROFILE_3_SLICE,
		4: nvml.GPU_INSTANCE_PROFILE_4_SLICE,
		7: nvml.GPU_INSTANCE_PROFILE_7_SLICE,
	}
	i, ok := index[slices]
	if !ok {
		return nil
	}
	return t.byIndex(i)
}

func (p *giProfile) info() nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id:                  p.id,
		IsP2pSupported:      0, // -lgip shows "P2P No" for every profile of these GPUs
		SliceCount:          p.slices,
		InstanceCount:       p.instances,
		MultiprocessorCount: p.sms,
		CopyEngineCount:     p.copyEngines,
		DecoderCount:        p.decoders,
		EncoderCount:        p.encoders,
		JpegCount:           p.jpegs,
		OfaCount:            p.ofas,
		MemorySizeMB:        p.memoryMiB,
	}
}

// ciProfile is one compute-instance profile inside a GPU-instance profile.
//
// `nvidia-smi mig -lcip` on a 3g.20gb GPU instance of an A100 lists 1c.3g.20gb (ID 0, 3
// instances, 14 SMs), 2c.3g.20gb (ID 1, 1 instance, 28 SMs) and 3g.20gb (ID 2, the default);
// compute-instance profile IDs equal NVML's COMPUTE_INSTANCE_PROFILE_* indexes. The general rule
// used here: a GPU instance with S compute slices offers c-slice compute instances for c in
// {1, 2, 3, 4, 7} with c <= S. ASSUMED (no public -lcipp output found): placements are in compute
// slices, aligned like the GPU-instance placements (c = 1, 2, 4 at multiples of c; c = 3 at
// multiples of 4), which gives the instance counts -lcip prints (7g: 7/3/2/1/1, 4g: 4/2/1/1,
// 3g: 3/1/1, 2g: 2/1); a partial compute instance has the SMs of the c-slice GPU-instance
// profile, the full one the SMs of its GPU instance; engines are shared with the GPU instance.
type ciProfile struct {
	index     int // == NVML profile ID
	name      string
	slices    uint32
	instances uint32
	sms       uint32
	starts    []uint32
	gi        *giProfile
}

var ciIndexBySlices = map[uint32]int{
	1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
	2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
	3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE,
	4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE,
	7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
}

// ciProfiles returns the compute-instance profiles of GPU-instance profile gi.
func (t *migTable) ciProfiles(gi *giProfile) []ciProfile {
	var out []ciProfile
	for _, c := range []uint32{1, 2, 3, 4, 7} {
		if c > gi.slices {
			break
		}
		align := c
		switch c {
		case 3:
			align = 4
		case 7:
			align = 8
		}
		var starts []uint32
		for s := uint32(0); s+c <= gi.slices; s += align {
			starts = append(starts, s)
		}
		p := ciProfile{
			index:     ciIndexBySlices[c],
			slices:    c,
			instances: uint32(len(starts)),
			starts:    starts,
			gi:        gi,
		}
		if c == gi.slices {
			p.name = gi.name
			p.sms = gi.sms
		} else {
			p.name = fmt.Sprintf("%dc.%s", c, gi.name)
			p.sms = t.bySlices(c).sms
		}
		out = append(out, p)
	}
	return out
}

// ciProfile returns compute-instance profile index of GPU-instance profile gi, or nil.
func (t *migTable) ciProfile(gi *giProfile, index int) *ciProfile {
	for _, p := range t.ciProfiles(gi) {
		if p.index == index {
			return &p
		}
	}
	return nil
}

func (p *ciProfile) info() nvml.ComputeInstanceProfileInfo {
	return nvml.ComputeInstanceProfileInfo{
		Id:                    uint32(p.index),
		SliceCount:            p.slices,
		InstanceCount:         p.instances,
		MultiprocessorCount:   p.sms,
		SharedCopyEngineCount: p.gi.copyEngines,
		SharedDecoderCount:    p.gi.decoders,
		SharedEncoderCount:    p.gi.encoders,
		SharedJpegCount:       p.gi.jpegs,
		SharedOfaCount:        p.gi.ofas,
	}
}

// giID is the GPU-instance ID NVML assigns to a placement: the node of the binary tree over the 8
// memory slices that the placement covers (8 slices: 0; 4: 1-2; 2: 3-6; 1: 7-14). It reproduces
// the IDs in the MIG User Guide's examples (7 x 1g.5gb -> 7..13 by start, 3g.20gb at 4 -> 2,
// 4g.20gb -> 1, 2g.10gb at 4 -> 5) and the 15 GI IDs (gi0..gi14) of
// /proc/driver/nvidia-caps/mig-minors.
func giID(start, size uint32) uint32 {
	return memorySlices/size - 1 + start/size
}
