package mig

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

func TestDestroy(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxh100")
	dev := device(t, m, 6)
	// Nothing to destroy while MIG mode is off.
	if err := Destroy(ctx, dev, 2, 0); err != nil {
		t.Fatalf("Destroy with MIG off: %v", err)
	}
	keep, err := Create(ctx, dev, 9, Placement{0, 4})
	if err != nil {
		t.Fatal(err)
	}
	inst, err := Create(ctx, dev, 9, Placement{4, 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := Destroy(ctx, dev, inst.GIID, inst.CIID); err != nil {
			t.Fatalf("Destroy %d: %v", i, err)
		}
	}
	gis := m.GpuInstances(6)
	if len(gis) != 1 || gis[0].ID != keep.GIID || len(gis[0].ComputeInstances) != 1 {
		t.Fatalf("after Destroy: %s, want only GI %d", layout(m, 6), keep.GIID)
	}
	// Unknown IDs are already gone.
	if err := Destroy(ctx, dev, 13, 0); err != nil {
		t.Errorf("Destroy of a missing instance: %v", err)
	}
	if err := Destroy(ctx, dev, 99, 7); err != nil {
		t.Errorf("Destroy of an impossible ID: %v", err)
	}

	// A GPU instance left without compute instance is destroyed too.
	gi := createGI(t, dev, 19, Placement{5, 1})
	info, _ := gi.GetInfo()
	if err := Destroy(ctx, dev, info.Id, 0); err != nil {
		t.Fatalf("Destroy of a GPU instance without compute instance: %v", err)
	}
	if n := len(m.GpuInstances(6)); n != 1 {
		t.Errorf("after Destroy: %s", layout(m, 6))
	}
}

func TestDestroyErrors(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxh100")
	dev := device(t, m, 1)
	inst, err := Create(ctx, dev, 14, Placement{0, 2})
	if err != nil {
		t.Fatal(err)
	}
	m.InjectError("ComputeInstance.Destroy", 1, nvml.ERROR_UNKNOWN, 1)
	err = Destroy(ctx, dev, inst.GIID, inst.CIID)
	if !errors.Is(err, nvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), m.GPUUUID(1)) || !strings.Contains(err.Error(), "0:2") {
		t.Fatalf("Destroy with failing compute instance: %v", err)
	}
	m.InjectError("GpuInstance.Destroy", 1, nvml.ERROR_UNKNOWN, 1)
	if err := Destroy(ctx, dev, inst.GIID, inst.CIID); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("Destroy with failing GPU instance: %v", err)
	}
	if gis := m.GpuInstances(1); len(gis) != 1 || len(gis[0].ComputeInstances) != 0 {
		t.Fatalf("after failed GPU-instance Destroy: %s, want the GI without CI", layout(m, 1))
	}
	// The retry finishes the job.
	if err := Destroy(ctx, dev, inst.GIID, inst.CIID); err != nil {
		t.Fatalf("retry: %v", err)
	}

	// Compute instances Destroy was not asked about are kept, and named.
	gi := createGI(t, dev, 9, Placement{4, 4})
	createCI(t, gi, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE)
	createCI(t, gi, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE)
	info, _ := gi.GetInfo()
	err = Destroy(ctx, dev, info.Id, 0)
	if !errors.Is(err, nvml.ERROR_IN_USE) || !strings.Contains(err.Error(), "[1]") {
		t.Fatalf("Destroy of a GPU instance with other compute instances: %v", err)
	}
}

func TestInstances(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxa100")
	dev := device(t, m, 7)
	if got, err := Instances(dev); got != nil || err != nil {
		t.Fatalf("Instances with MIG off = %+v, %v", got, err)
	}
	a, err := Create(ctx, dev, 14, Placement{2, 2})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Create(ctx, dev, 20, Placement{1, 1})
	if err != nil {
		t.Fatal(err)
	}
	// An administrator's 3g.20gb split into a 2-slice and a 1-slice compute instance, and a
	// 1g.5gb left without compute instance.
	split := createGI(t, dev, 9, Placement{4, 4})
	createCI(t, split, nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE)
	createCI(t, split, nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE)
	createGI(t, dev, 19, Placement{0, 1})

	got, err := Instances(dev)
	if err != nil {
		t.Fatal(err)
	}
	uuids := map[[2]uint32]string{}
	for _, gi := range m.GpuInstances(7) {
		for _, ci := range gi.ComputeInstances {
			uuids[[2]uint32{gi.ID, ci.ID}] = ci.UUID
		}
	}
	var lines []string
	for _, inst := range got {
		if inst.GPUUUID != m.GPUUUID(7) {
			t.Errorf("%s: GPU UUID %q", &inst, inst.GPUUUID)
		}
		line := fmt.Sprintf("%s complete=%v", &inst, inst.Complete())
		for _, ci := range inst.ComputeInstances {
			if ci.UUID == "" || ci.UUID != uuids[[2]uint32{inst.GIID, ci.ID}] {
				t.Errorf("%s CI %d: UUID %q, simulation has %q", &inst, ci.ID, ci.UUID, uuids[[2]uint32{inst.GIID, ci.ID}])
			}
			line += fmt.Sprintf(" [CI %d profile %d %d slices at %s]", ci.ID, ci.ProfileID, ci.ComputeSlices, ci.Placement)
		}
		lines = append(lines, line)
	}
	want := []string{
		"GI 2 (3g.20gb at 4:4) complete=false [CI 0 profile 1 2 slices at 0:2] [CI 1 profile 0 1 slices at 2:1]",
		"GI 4 (2g.10gb at 2:2) complete=true [CI 0 profile 1 2 slices at 0:2]",
		"GI 7 (1g.5gb at 0:1) complete=false",
		"GI 8 (1g.5gb+me at 1:1) complete=true [CI 0 profile 0 1 slices at 0:1]",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("Instances:\n got %s\nwant %s", strings.Join(lines, "\n    "), strings.Join(want, "\n    "))
	}
	for _, created := range []*Instance{a, b} {
		found, err := Find(dev, created.Profile.ID, created.Placement)
		if err != nil || found == nil || found.UUID != created.UUID || found.CIID != created.CIID {
			t.Errorf("Find(%s) = %+v, %v", created, found, err)
		}
	}
	if found, err := Find(dev, 19, Placement{3, 1}); found != nil || err != nil {
		t.Errorf("Find of a missing instance = %+v, %v", found, err)
	}
	id := a.DeviceID(a.CIID)
	if want := fmt.Sprintf("%s/gi4/ci0", m.GPUUUID(7)); id.String() != want {
		t.Errorf("DeviceID = %s, want %s", id, want)
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	ctx := testContext(t)
	state := filepath.Join(t.TempDir(), "state.json")
	m := newMachine(t, "dgxh100", nvmlsim.WithStateFile(state))
	created, err := Create(ctx, device(t, m, 2), 15, Placement{2, 2})
	if err != nil {
		t.Fatal(err)
	}
	m.Shutdown()

	m = newMachine(t, "dgxh100", nvmlsim.WithStateFile(state))
	dev := device(t, m, 2)
	instances, err := Instances(dev)
	if err != nil {
		t.Fatal(err)
	}
	if len(instances) != 1 || instances[0].UUID != created.UUID || instances[0].GIID != created.GIID ||
		instances[0].Profile.Name != "1g.20gb" || instances[0].Placement != (Placement{2, 2}) {
		t.Fatalf("after restart: %+v, want %+v", instances, created)
	}
	found, err := Find(dev, 15, Placement{2, 2})
	if err != nil || found == nil || found.UUID != created.UUID {
		t.Fatalf("Find after restart = %+v, %v", found, err)
	}
	again, err := Create(ctx, dev, 15, Placement{2, 2})
	if err != nil || !again.Adopted || again.UUID != created.UUID {
		t.Fatalf("Create after restart = %+v, %v; want the instance adopted", again, err)
	}
	if err := Destroy(ctx, dev, again.GIID, again.CIID); err != nil {
		t.Fatal(err)
	}
	if changed, err := DisableIfUnused(ctx, dev); !changed || err != nil {
		t.Fatalf("DisableIfUnused = %v, %v", changed, err)
	}
	m.Shutdown()

	m = newMachine(t, "dgxh100", nvmlsim.WithStateFile(state))
	if mode := migMode(t, device(t, m, 2)); mode != nvml.DEVICE_MIG_DISABLE || m.GpuInstances(2) != nil {
		t.Fatalf("after second restart: MIG mode %d, instances %s", mode, layout(m, 2))
	}
}

func TestDisableIfUnused(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxh100")
	dev := device(t, m, 0)
	check := func(wantChanged bool, wantMode int) {
		t.Helper()
		changed, err := DisableIfUnused(ctx, dev)
		if err != nil || changed != wantChanged {
			t.Fatalf("DisableIfUnused = %v, %v; want %v, nil", changed, err, wantChanged)
		}
		if mode := migMode(t, dev); mode != wantMode {
			t.Fatalf("MIG mode %d, want %d", mode, wantMode)
		}
	}
	check(false, nvml.DEVICE_MIG_DISABLE)
	a, err := Create(ctx, dev, 19, Placement{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Create(ctx, dev, 19, Placement{1, 1})
	if err != nil {
		t.Fatal(err)
	}
	check(false, nvml.DEVICE_MIG_ENABLE)
	if err := Destroy(ctx, dev, a.GIID, a.CIID); err != nil {
		t.Fatal(err)
	}
	check(false, nvml.DEVICE_MIG_ENABLE)
	if err := Destroy(ctx, dev, b.GIID, b.CIID); err != nil {
		t.Fatal(err)
	}
	check(true, nvml.DEVICE_MIG_DISABLE)
	check(false, nvml.DEVICE_MIG_DISABLE)

	// A GPU instance without compute instance still counts as in use.
	enableMIGMode(t, dev)
	gi := createGI(t, dev, 0, Placement{0, 8})
	check(false, nvml.DEVICE_MIG_ENABLE)
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}

	// Failures are reported, and MIG mode stays on.
	m.InjectError("SetMigMode", 0, nvml.ERROR_IN_USE, 1)
	if changed, err := DisableIfUnused(ctx, dev); changed || !errors.Is(err, ErrGPUInUse) || !strings.Contains(err.Error(), m.GPUUUID(0)) {
		t.Fatalf("DisableIfUnused with a busy GPU = %v, %v", changed, err)
	}
	if mode := migMode(t, dev); mode != nvml.DEVICE_MIG_ENABLE {
		t.Fatalf("MIG mode %d after failed disable", mode)
	}
	check(true, nvml.DEVICE_MIG_DISABLE)
}
