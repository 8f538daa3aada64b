package mig

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// lgipp renders profiles like `nvidia-smi mig -lgipp`, prefixed with ID and name.
func lgipp(profiles []Profile) []string {
	var out []string
	for _, p := range profiles {
		var starts []string
		for _, pl := range p.Placements {
			starts = append(starts, fmt.Sprint(pl.Start))
		}
		out = append(out, fmt.Sprintf("%d %s {%s}:%d", p.ID, p.Name, strings.Join(starts, ","), p.MemorySlices))
	}
	return out
}

func TestProfiles(t *testing.T) {
	tests := map[string][]string{
		"dgxa100": {
			"19 1g.5gb {0,1,2,3,4,5,6}:1", "20 1g.5gb+me {0,1,2,3,4,5,6}:1", "15 1g.10gb {0,2,4,6}:2",
			"14 2g.10gb {0,2,4}:2", "9 3g.20gb {0,4}:4", "5 4g.20gb {0}:4", "0 7g.40gb {0}:8",
		},
		"dgxh100": {
			"19 1g.10gb {0,1,2,3,4,5,6}:1", "20 1g.10gb+me {0,1,2,3,4,5,6}:1", "15 1g.20gb {0,2,4,6}:2",
			"14 2g.20gb {0,2,4}:2", "9 3g.40gb {0,4}:4", "5 4g.40gb {0}:4", "0 7g.80gb {0}:8",
		},
		"dgxh200": {
			"19 1g.18gb {0,1,2,3,4,5,6}:1", "20 1g.18gb+me {0,1,2,3,4,5,6}:1", "15 1g.35gb {0,2,4,6}:2",
			"14 2g.35gb {0,2,4}:2", "9 3g.71gb {0,4}:4", "5 4g.71gb {0}:4", "0 7g.141gb {0}:8",
		},
		"dgxb200": {
			"19 1g.23gb {0,1,2,3,4,5,6}:1", "20 1g.23gb+me {0,1,2,3,4,5,6}:1", "15 1g.45gb {0,2,4,6}:2",
			"14 2g.45gb {0,2,4}:2", "9 3g.90gb {0,4}:4", "5 4g.90gb {0}:4", "0 7g.180gb {0}:8",
		},
	}
	for machine, want := range tests {
		t.Run(machine, func(t *testing.T) {
			m := newMachine(t, machine)
			for i := range m.GPUCount() {
				profiles, err := Profiles(device(t, m, i))
				if err != nil {
					t.Fatalf("Profiles(GPU %d): %v", i, err)
				}
				if got := lgipp(profiles); !slices.Equal(got, want) {
					t.Fatalf("GPU %d profiles:\n got %q\nwant %q", i, got, want)
				}
			}
		})
	}
}

func TestProfileFields(t *testing.T) {
	m := newMachine(t, "dgxh100")
	profiles, err := Profiles(device(t, m, 0))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Profile{}
	for _, p := range profiles {
		byName[p.Name] = p
	}
	all := func(n uint32) []Placement {
		var out []Placement
		for s := range n {
			out = append(out, Placement{Start: s, Size: 1})
		}
		return out
	}
	tests := map[string]Profile{
		"1g.10gb": {Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE, ID: 19, Name: "1g.10gb", ComputeSlices: 1, MemorySlices: 1,
			MemoryBytes: 9984 << 20, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, MaxInstances: 7, Placements: all(7)},
		"1g.10gb+me": {Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, ID: 20, Name: "1g.10gb+me", ComputeSlices: 1, MemorySlices: 1,
			MemoryBytes: 9984 << 20, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGs: 1, OFAs: 1, MaxInstances: 1, Placements: all(7)},
		"1g.20gb": {Index: nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, ID: 15, Name: "1g.20gb", ComputeSlices: 1, MemorySlices: 2,
			MemoryBytes: 20096 << 20, Multiprocessors: 26, CopyEngines: 1, Decoders: 1, JPEGs: 1, MaxInstances: 4,
			Placements: []Placement{{0, 2}, {2, 2}, {4, 2}, {6, 2}}},
		"3g.40gb": {Index: nvml.GPU_INSTANCE_PROFILE_3_SLICE, ID: 9, Name: "3g.40gb", ComputeSlices: 3, MemorySlices: 4,
			MemoryBytes: 40448 << 20, Multiprocessors: 60, CopyEngines: 3, Decoders: 3, JPEGs: 3, MaxInstances: 2,
			Placements: []Placement{{0, 4}, {4, 4}}},
		"7g.80gb": {Index: nvml.GPU_INSTANCE_PROFILE_7_SLICE, ID: 0, Name: "7g.80gb", ComputeSlices: 7, MemorySlices: 8,
			MemoryBytes: 81152 << 20, Multiprocessors: 132, CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1, MaxInstances: 1,
			Placements: []Placement{{0, 8}}},
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := byName[name]
			if !ok {
				t.Fatalf("no profile %s among %q", name, lgipp(profiles))
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestTotals(t *testing.T) {
	tests := map[string]Totals{
		"dgxa100": {MemorySlices: 8, ComputeSlices: 7, MemoryBytes: 40192 << 20, Multiprocessors: 98,
			CopyEngines: 7, Decoders: 5, JPEGs: 1, OFAs: 1},
		"dgxh100": {MemorySlices: 8, ComputeSlices: 7, MemoryBytes: 81152 << 20, Multiprocessors: 132,
			CopyEngines: 8, Decoders: 7, JPEGs: 7, OFAs: 1},
		"dgxb200": {MemorySlices: 8, ComputeSlices: 7, MemoryBytes: 182784 << 20, Multiprocessors: 148,
			CopyEngines: 16, Decoders: 7, JPEGs: 7, OFAs: 1},
	}
	for machine, want := range tests {
		t.Run(machine, func(t *testing.T) {
			m := newMachine(t, machine)
			profiles, err := Profiles(device(t, m, 0))
			if err != nil {
				t.Fatal(err)
			}
			if got := TotalsOf(profiles); got != want {
				t.Errorf("TotalsOf:\n got %+v\nwant %+v", got, want)
			}
			// Every profile's largest packing fits the totals: the counter model relies on it.
			got := TotalsOf(profiles)
			for _, p := range profiles {
				n := min(p.MaxInstances, len(p.Placements))
				if n*p.Decoders > got.Decoders || n*p.JPEGs > got.JPEGs || n*p.ComputeSlices > got.ComputeSlices {
					t.Errorf("%d x %s need more than the totals %+v", n, p.Name, got)
				}
			}
		})
	}
	if got := TotalsOf(nil); got != (Totals{}) {
		t.Errorf("TotalsOf(nil) = %+v, want zero", got)
	}
}

func TestNotCapable(t *testing.T) {
	m := newMachine(t, "l4x4")
	dev := device(t, m, 0)
	if _, err := Profiles(dev); !errors.Is(err, ErrNotCapable) || !strings.Contains(err.Error(), m.GPUUUID(0)) {
		t.Errorf("Profiles on an L4: %v, want ErrNotCapable naming the GPU", err)
	}
	if info, err := Describe(dev); info != nil || err != nil {
		t.Errorf("Describe on an L4 = %+v, %v; want nil, nil", info, err)
	}
	if got, err := Instances(dev); got != nil || err != nil {
		t.Errorf("Instances on an L4 = %+v, %v; want nil, nil", got, err)
	}
	if _, err := Create(testContext(t), dev, 19, Placement{0, 1}); !errors.Is(err, ErrNotCapable) {
		t.Errorf("Create on an L4: %v, want ErrNotCapable", err)
	}
	if changed, err := DisableIfUnused(testContext(t), dev); changed || err != nil {
		t.Errorf("DisableIfUnused on an L4 = %v, %v; want false, nil", changed, err)
	}
	if err := Destroy(testContext(t), dev, 1, 0); err != nil {
		t.Errorf("Destroy on an L4: %v, want nil (nothing to destroy)", err)
	}
}

func TestDescribe(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxh100")
	dev := device(t, m, 1)
	info, err := Describe(dev)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Profiles) != 7 || info.MemorySlices != 8 || info.ComputeSlices != 7 || info.Instances != nil {
		t.Fatalf("Describe with MIG off: %+v", info)
	}
	inst, err := Create(ctx, dev, 14, Placement{2, 2})
	if err != nil {
		t.Fatal(err)
	}
	info, err = Describe(dev)
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Instances) != 1 || info.Instances[0].UUID != inst.UUID {
		t.Fatalf("Describe after Create: instances %+v, want the one created (%s)", info.Instances, inst.UUID)
	}
}

func TestProfileName(t *testing.T) {
	const h100 = 81559 << 20
	tests := []struct {
		index     int
		slices    uint32
		memoryMiB uint64
		gpuBytes  uint64
		want      string
	}{
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 9984, h100, "1g.10gb"},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 1, 9984, h100, "1g.10gb+me"},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 1, 20096, h100, "1g.20gb"},
		{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 7, 81152, h100, "7g.80gb"}, // 79.25 GiB
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, 1, 9984, h100, "1g.10gb+me.all"},
		{nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME, 2, 20096, h100, "2g.20gb-me"},
		{nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX, 4, 40448, h100, "4g.40gb+gfx"},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 16384, 143771 << 20, "1g.18gb"}, // H200: 16 GiB
		{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 3, 67072, 143771 << 20, "3g.71gb"},
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 20992, 183359 << 20, "1g.23gb"}, // B200: 22.5 rounds up
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 4864, 40960 << 20, "1g.5gb"},    // A100 40GB
		{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 1, 9984, 0, "1g.10gb"},             // GPU memory unknown
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := profileName(tc.index, tc.slices, tc.memoryMiB, tc.gpuBytes); got != tc.want {
				t.Errorf("profileName = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPlacement(t *testing.T) {
	tests := []struct {
		a, b Placement
		want bool
	}{
		{Placement{0, 4}, Placement{2, 2}, true},
		{Placement{0, 4}, Placement{4, 4}, false},
		{Placement{6, 2}, Placement{6, 1}, true},
		{Placement{0, 8}, Placement{7, 1}, true},
		{Placement{3, 1}, Placement{4, 1}, false},
	}
	for _, tc := range tests {
		if got := tc.a.Overlaps(tc.b); got != tc.want || tc.b.Overlaps(tc.a) != tc.want {
			t.Errorf("%v overlaps %v = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
	if got := (Placement{4, 4}).String(); got != "4:4" {
		t.Errorf("String = %q", got)
	}
}
