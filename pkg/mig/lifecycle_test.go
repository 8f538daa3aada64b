package mig

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestCreate(t *testing.T) {
	type step struct {
		profileID uint32
		placement Placement
	}
	tests := map[string]struct {
		machine string
		steps   []step
		// want is the simulation's layout afterwards (see layout), MIG UUIDs left out.
		want string
	}{
		"H100 3g.40gb at 4": {
			machine: "dgxh100",
			steps:   []step{{9, Placement{4, 4}}},
			want:    "GI 2 9@4:4 [CI 0 2@0:3]",
		},
		"H100 7g.80gb": {
			machine: "dgxh100",
			steps:   []step{{0, Placement{0, 8}}},
			want:    "GI 0 0@0:8 [CI 0 4@0:7]",
		},
		"H100 mixed, exact placements": {
			machine: "dgxh100",
			steps: []step{
				{15, Placement{6, 2}}, {19, Placement{0, 1}}, {20, Placement{1, 1}},
				{14, Placement{2, 2}}, {19, Placement{4, 1}}, {19, Placement{5, 1}},
			},
			want: "GI 4 14@2:2 [CI 0 1@0:2]; GI 6 15@6:2 [CI 0 0@0:1]; GI 7 19@0:1 [CI 0 0@0:1]; " +
				"GI 8 20@1:1 [CI 0 0@0:1]; GI 11 19@4:1 [CI 0 0@0:1]; GI 12 19@5:1 [CI 0 0@0:1]",
		},
		"A100 seven 1g.5gb from the top": {
			machine: "dgxa100",
			steps: []step{
				{19, Placement{6, 1}}, {19, Placement{5, 1}}, {19, Placement{4, 1}}, {19, Placement{3, 1}},
				{19, Placement{2, 1}}, {19, Placement{1, 1}}, {19, Placement{0, 1}},
			},
			want: "GI 7 19@0:1 [CI 0 0@0:1]; GI 8 19@1:1 [CI 0 0@0:1]; GI 9 19@2:1 [CI 0 0@0:1]; " +
				"GI 10 19@3:1 [CI 0 0@0:1]; GI 11 19@4:1 [CI 0 0@0:1]; GI 12 19@5:1 [CI 0 0@0:1]; GI 13 19@6:1 [CI 0 0@0:1]",
		},
		"A100 4g.20gb and 2g.10gb": {
			machine: "dgxa100",
			steps:   []step{{5, Placement{0, 4}}, {14, Placement{4, 2}}},
			want:    "GI 1 5@0:4 [CI 0 3@0:4]; GI 5 14@4:2 [CI 0 1@0:2]",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			m := newMachine(t, tc.machine)
			dev := device(t, m, 3)
			if migMode(t, dev) != nvml.DEVICE_MIG_DISABLE {
				t.Fatal("MIG mode is on before the first Create")
			}
			for _, s := range tc.steps {
				inst, err := Create(ctx, dev, s.profileID, s.placement)
				if err != nil {
					t.Fatalf("Create(%d, %v): %v", s.profileID, s.placement, err)
				}
				if inst.Profile.ID != s.profileID || inst.Placement != s.placement || inst.Adopted {
					t.Errorf("Create(%d, %v) = %+v", s.profileID, s.placement, inst)
				}
				wantUUID := ""
				for _, gi := range m.GpuInstances(3) {
					if gi.ID == inst.GIID && len(gi.ComputeInstances) == 1 && gi.ComputeInstances[0].ID == inst.CIID {
						wantUUID = gi.ComputeInstances[0].UUID
					}
				}
				if !strings.HasPrefix(inst.UUID, "MIG-") || inst.UUID != wantUUID {
					t.Errorf("Create(%d, %v): UUID %q, simulation has %q for GI %d CI %d", s.profileID, s.placement,
						inst.UUID, wantUUID, inst.GIID, inst.CIID)
				}
				if ci, ok := inst.Full(); !ok || ci.ComputeSlices != inst.Profile.ComputeSlices || !inst.Complete() {
					t.Errorf("Create(%d, %v): no full compute instance in %+v", s.profileID, s.placement, inst)
				}
			}
			if migMode(t, dev) != nvml.DEVICE_MIG_ENABLE {
				t.Error("MIG mode is still off after Create")
			}
			got := layout(m, 3)
			for _, gi := range m.GpuInstances(3) {
				for _, ci := range gi.ComputeInstances {
					got = strings.ReplaceAll(got, " "+ci.UUID, "")
				}
			}
			if got != tc.want {
				t.Errorf("layout:\n got %s\nwant %s", got, tc.want)
			}
			for i := range m.GPUCount() {
				if i != 3 && m.GpuInstances(i) != nil {
					t.Errorf("GPU %d has instances: %s", i, layout(m, i))
				}
			}
		})
	}
}

func TestCreateErrors(t *testing.T) {
	tests := map[string]struct {
		existing  []Placement // 3g.40gb instances created first
		profileID uint32
		placement Placement
		wantErr   []error
		wantText  []string
	}{
		"overlapping placement": {
			existing:  []Placement{{0, 4}},
			profileID: 14, placement: Placement{2, 2},
			wantErr:  []error{ErrPlacementInUse},
			wantText: []string{"2g.20gb", "2:2", "overlaps GI 1 (3g.40gb at 0:4)"},
		},
		"whole GPU over an instance": {
			existing:  []Placement{{4, 4}},
			profileID: 0, placement: Placement{0, 8},
			wantErr:  []error{ErrPlacementInUse},
			wantText: []string{"7g.80gb", "0:8", "overlaps GI 2 (3g.40gb at 4:4)"},
		},
		"placement the profile cannot take": {
			profileID: 9, placement: Placement{2, 4},
			wantErr:  []error{ErrInvalidPlacement},
			wantText: []string{"3g.40gb", "2:4", "0:4, 4:4"},
		},
		"wrong size": {
			profileID: 15, placement: Placement{0, 1},
			wantErr:  []error{ErrInvalidPlacement},
			wantText: []string{"1g.20gb", "0:1", "0:2, 2:2, 4:2, 6:2"},
		},
		"unknown profile": {
			profileID: 42, placement: Placement{0, 1},
			wantErr:  []error{ErrUnknownProfile},
			wantText: []string{"42", "19 (1g.10gb)", "0 (7g.80gb)"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			m := newMachine(t, "dgxh100")
			dev := device(t, m, 0)
			for _, pl := range tc.existing {
				if _, err := Create(ctx, dev, 9, pl); err != nil {
					t.Fatal(err)
				}
			}
			before := layout(m, 0)
			_, err := Create(ctx, dev, tc.profileID, tc.placement)
			if err == nil {
				t.Fatal("Create succeeded")
			}
			t.Logf("error: %v", err)
			for _, want := range tc.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("error %q is not %v", err, want)
				}
			}
			for _, want := range append(tc.wantText, m.GPUUUID(0)) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			if after := layout(m, 0); after != before {
				t.Errorf("failed Create changed the GPU:\nbefore %s\nafter  %s", before, after)
			}
		})
	}
}

func TestCreateInstanceLimit(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxh100")
	dev := device(t, m, 0)
	if _, err := Create(ctx, dev, 20, Placement{0, 1}); err != nil {
		t.Fatal(err)
	}
	// 1g.10gb+me exists once per GPU (it holds the only OFA).
	_, err := Create(ctx, dev, 20, Placement{3, 1})
	if !errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES) || !strings.Contains(err.Error(), "1g.10gb+me") ||
		!strings.Contains(err.Error(), "3:1") {
		t.Fatalf("second 1g.10gb+me: %v, want ERROR_INSUFFICIENT_RESOURCES naming profile and placement", err)
	}
	if n := len(m.GpuInstances(0)); n != 1 {
		t.Errorf("%d GPU instances, want 1: %s", n, layout(m, 0))
	}
}

func TestCreateAdopts(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxh100")
	dev := device(t, m, 0)
	first, err := Create(ctx, dev, 14, Placement{4, 2})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Create(ctx, dev, 14, Placement{4, 2})
	if err != nil {
		t.Fatalf("second Create: %v", err)
	}
	if !again.Adopted || again.GIID != first.GIID || again.CIID != first.CIID || again.UUID != first.UUID {
		t.Errorf("second Create = %+v, want the first instance %+v adopted", again, first)
	}
	if n := len(m.GpuInstances(0)); n != 1 {
		t.Errorf("%d GPU instances after two Creates, want 1: %s", n, layout(m, 0))
	}
}

// A crash between creating the GPU instance and its compute instance leaves a GPU instance
// without compute instance: Create adopts and completes it.
func TestCreateCompletesCrashedInstance(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxh100")
	dev := device(t, m, 5)
	enableMIGMode(t, dev)
	createGI(t, dev, 9, Placement{0, 4})

	inst, err := Create(ctx, dev, 9, Placement{0, 4})
	if err != nil {
		t.Fatal(err)
	}
	gis := m.GpuInstances(5)
	if len(gis) != 1 || len(gis[0].ComputeInstances) != 1 || gis[0].ID != inst.GIID ||
		gis[0].ComputeInstances[0].UUID != inst.UUID || !inst.Adopted {
		t.Fatalf("Create = %+v; simulation: %s", inst, layout(m, 5))
	}
}

// A GPU instance someone else split into compute instances is not taken over.
func TestCreateRefusesPartialComputeInstances(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxh100")
	dev := device(t, m, 0)
	enableMIGMode(t, dev)
	gi := createGI(t, dev, 9, Placement{4, 4})
	createCI(t, gi, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE)
	before := layout(m, 0)

	_, err := Create(ctx, dev, 9, Placement{4, 4})
	if !errors.Is(err, ErrPlacementInUse) || !strings.Contains(err.Error(), "3g.40gb") {
		t.Fatalf("Create over a split GPU instance: %v, want ErrPlacementInUse", err)
	}
	if after := layout(m, 0); after != before {
		t.Errorf("Create changed the GPU:\nbefore %s\nafter  %s", before, after)
	}
}

// If the compute instance cannot be created, the GPU instance Create just made is destroyed again.
func TestCreateRollsBack(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxh100")
	dev := device(t, m, 2)
	m.InjectError("GpuInstance.CreateComputeInstance", 2, nvml.ERROR_UNKNOWN, 1)

	_, err := Create(ctx, dev, 5, Placement{0, 4})
	if !errors.Is(err, nvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), "4g.40gb") || !strings.Contains(err.Error(), m.GPUUUID(2)) {
		t.Fatalf("Create with failing compute instance: %v", err)
	}
	if gis := m.GpuInstances(2); gis != nil {
		t.Fatalf("GPU instance left behind: %s", layout(m, 2))
	}
	if _, err := Create(ctx, dev, 5, Placement{0, 4}); err != nil {
		t.Fatalf("retry: %v", err)
	}

	// A failure after the compute instance exists rolls back both instances.
	dev = device(t, m, 3)
	m.InjectError("ComputeInstance.GetInfo", 3, nvml.ERROR_UNKNOWN, 1)
	if _, err := Create(ctx, dev, 14, Placement{0, 2}); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("Create with failing compute instance info: %v", err)
	}
	if gis := m.GpuInstances(3); gis != nil {
		t.Fatalf("instances left behind: %s", layout(m, 3))
	}

	// When the rollback fails too, both failures are reported and the retry completes the
	// GPU instance left behind.
	dev = device(t, m, 4)
	m.InjectError("GpuInstance.CreateComputeInstance", 4, nvml.ERROR_UNKNOWN, 1)
	m.InjectError("GpuInstance.Destroy", 4, nvml.ERROR_TIMEOUT, 1)
	_, err = Create(ctx, dev, 9, Placement{4, 4})
	if !errors.Is(err, nvml.ERROR_UNKNOWN) || !errors.Is(err, nvml.ERROR_TIMEOUT) {
		t.Fatalf("Create with failing compute instance and rollback: %v", err)
	}
	inst, err := Create(ctx, dev, 9, Placement{4, 4})
	if err != nil || !inst.Adopted || !inst.Complete() {
		t.Fatalf("retry after failed rollback = %+v, %v", inst, err)
	}
}

// A GPU instance left without compute instance stays when completing it fails: it is not Create's
// to destroy, and the next attempt completes it.
func TestCreateKeepsAdoptedOnFailure(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxh100")
	dev := device(t, m, 0)
	enableMIGMode(t, dev)
	createGI(t, dev, 19, Placement{6, 1})
	m.InjectError("GpuInstance.CreateComputeInstance", 0, nvml.ERROR_UNKNOWN, 1)
	if _, err := Create(ctx, dev, 19, Placement{6, 1}); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("Create: %v, want ERROR_UNKNOWN", err)
	}
	if gis := m.GpuInstances(0); len(gis) != 1 || len(gis[0].ComputeInstances) != 0 {
		t.Fatalf("adopted GPU instance changed: %s", layout(m, 0))
	}
	if inst, err := Create(ctx, dev, 19, Placement{6, 1}); err != nil || !inst.Complete() {
		t.Fatalf("retry = %+v, %v", inst, err)
	}
}

func TestCreateMIGMode(t *testing.T) {
	tests := map[string]struct {
		fake    func(dev nvml.Device) nvml.Device
		inject  string
		ret     nvml.Return
		wantErr []error
	}{
		"processes on the GPU": {
			fake: func(dev nvml.Device) nvml.Device {
				return &fakeDevice{Device: dev, processes: []nvml.ProcessInfo{{Pid: 4242}}}
			},
			wantErr: []error{ErrGPUInUse},
		},
		"driver cannot reset (pass-through)": {
			inject: "SetMigMode", ret: nvml.ERROR_RESET_REQUIRED,
			wantErr: []error{ErrResetRequired, nvml.ERROR_RESET_REQUIRED},
		},
		"GPU busy during the reset": {
			inject: "SetMigMode", ret: nvml.ERROR_IN_USE,
			wantErr: []error{ErrGPUInUse, nvml.ERROR_IN_USE},
		},
		"mode only pending (A100 without reset)": {
			fake: func(dev nvml.Device) nvml.Device {
				return &fakeDevice{Device: dev, noReset: true, current: nvml.DEVICE_MIG_DISABLE, pending: nvml.DEVICE_MIG_DISABLE}
			},
			wantErr: []error{ErrResetRequired},
		},
		"no permission": {
			inject: "SetMigMode", ret: nvml.ERROR_NO_PERMISSION,
			wantErr: []error{nvml.ERROR_NO_PERMISSION},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := testContext(t)
			m := newMachine(t, "dgxa100")
			dev := device(t, m, 0)
			if tc.fake != nil {
				dev = tc.fake(dev)
			}
			if tc.inject != "" {
				m.InjectError(tc.inject, 0, tc.ret, 1)
			}
			_, err := Create(ctx, dev, 9, Placement{0, 4})
			if err == nil {
				t.Fatal("Create succeeded")
			}
			t.Logf("error: %v", err)
			for _, want := range tc.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("error %q is not %v", err, want)
				}
			}
			if !strings.Contains(err.Error(), m.GPUUUID(0)) || !strings.Contains(err.Error(), "3g.20gb") {
				t.Errorf("error %q does not name GPU and profile", err)
			}
			if gis := m.GpuInstances(0); gis != nil {
				t.Errorf("instances created: %s", layout(m, 0))
			}
		})
	}
}

// An A100 whose MIG mode is pending: Create keeps failing with ErrResetRequired, and
// DisableIfUnused cancels the pending change.
func TestPendingMIGMode(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxa100")
	fake := &fakeDevice{Device: device(t, m, 0), noReset: true, current: nvml.DEVICE_MIG_DISABLE, pending: nvml.DEVICE_MIG_DISABLE}
	for i := range 2 {
		if _, err := Create(ctx, fake, 19, Placement{0, 1}); !errors.Is(err, ErrResetRequired) {
			t.Fatalf("Create %d: %v, want ErrResetRequired", i, err)
		}
	}
	if fake.pending != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("pending mode %d, want enabled", fake.pending)
	}
	changed, err := DisableIfUnused(ctx, fake)
	if err != nil || changed || fake.pending != nvml.DEVICE_MIG_DISABLE {
		t.Fatalf("DisableIfUnused = %v, %v; pending %d; want false, nil, pending disabled", changed, err, fake.pending)
	}
}

// An A100 in MIG mode with a disable pending: Create cancels the pending disable, which a reset
// would otherwise apply under the new instance.
func TestCreateCancelsPendingDisable(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxa100")
	dev := device(t, m, 0)
	enableMIGMode(t, dev)
	fake := &fakeDevice{Device: dev, noReset: true, current: nvml.DEVICE_MIG_ENABLE, pending: nvml.DEVICE_MIG_DISABLE}
	inst, err := Create(ctx, fake, 19, Placement{3, 1})
	if err != nil || !inst.Complete() {
		t.Fatalf("Create = %+v, %v", inst, err)
	}
	if fake.pending != nvml.DEVICE_MIG_ENABLE {
		t.Errorf("pending MIG mode %d, want enabled", fake.pending)
	}
}
