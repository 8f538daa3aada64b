package nvmlsim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestStateSurvivesRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sim", "nvml-state.json")
	m := started(t, "dgxh100", WithSeed("node-1"), WithStateFile(path))
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("New did not create the state file: %v", err)
	}
	d := migGPU(t, m, 3)
	oneG := profileByID(t, d, 19)
	twoG := profileByID(t, d, 14)
	gi := get(d.CreateGpuInstanceWithPlacement(&twoG, &nvml.GpuInstancePlacement{Start: 2, Size: 2})).must(t, "2g at 2")
	get(d.CreateGpuInstance(&oneG)).must(t, "1g")
	oneC := get(gi.GetComputeInstanceProfileInfo(0, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)).must(t, "1c")
	get(gi.CreateComputeInstance(&oneC)).must(t, "1c")
	if ret := device(t, m, 5).SetComputeMode(nvml.COMPUTEMODE_PROHIBITED); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := m.SetTimeslice(6, 2); err != nil {
		t.Fatal(err)
	}
	if err := m.SetGPULost(7, true); err != nil {
		t.Fatal(err)
	}
	m.InjectEvent(1, nvml.EventTypeDoubleBitEccError, 0)
	want := m.GpuInstances(3)
	migUUID := get(get(d.GetMigDeviceHandleByIndex(0)).must(t, "MIG 0").GetUUID()).must(t, "UUID")

	// A new process: what was created is there, with the same IDs, placements and UUIDs.
	r := started(t, "dgxh100", WithSeed("node-1"), WithStateFile(path))
	got := r.GpuInstances(3)
	if len(got) != 2 || len(want) != 2 {
		t.Fatalf("GPU instances after restart %+v, before %+v", got, want)
	}
	for i := range want {
		if got[i].ID != want[i].ID || got[i].Start != want[i].Start || got[i].ProfileID != want[i].ProfileID ||
			len(got[i].ComputeInstances) != len(want[i].ComputeInstances) {
			t.Errorf("GPU instance %d after restart %+v, before %+v", i, got[i], want[i])
		}
	}
	rd := device(t, r, 3)
	if cur, pending := get2(rd.GetMigMode()); cur != nvml.DEVICE_MIG_ENABLE || pending != nvml.DEVICE_MIG_ENABLE {
		t.Errorf("MIG mode after restart %d/%d", cur, pending)
	}
	if u := get(get(rd.GetMigDeviceHandleByIndex(0)).must(t, "MIG 0").GetUUID()).must(t, "UUID"); u != migUUID {
		t.Errorf("MIG UUID after restart %s, before %s", u, migUUID)
	}
	if mode := get(device(t, r, 5).GetComputeMode()).must(t, "GetComputeMode"); mode != nvml.COMPUTEMODE_PROHIBITED {
		t.Errorf("compute mode after restart %v", mode)
	}
	if r.Timeslice(6) != 2 || !r.GPULost(7) {
		t.Errorf("time-slice %d, lost %v after restart", r.Timeslice(6), r.GPULost(7))
	}
	if n := get(device(t, r, 1).GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)).must(t, "ECC"); n != 1 {
		t.Errorf("uncorrected ECC errors after restart %d, want 1", n)
	}
	// The restored instances obey the rules: the 2g at 2 still blocks a 3g at 0.
	threeG := profileByID(t, rd, 9)
	if _, ret := rd.CreateGpuInstanceWithPlacement(&threeG, &nvml.GpuInstancePlacement{Start: 0, Size: 4}); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("3g over a restored 2g: %v", ret)
	}
	// Writes are atomic: no temporary files are left next to the state file.
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("state directory holds %d entries, want only the state file", len(entries))
	}
}

func TestStateFileMismatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	if _, err := New("dgxa100", WithSeed("a"), WithStateFile(path)); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		machine string
		seed    string
		content string
		want    string
	}{
		"other machine": {"dgxh100", "a", "", `describes machine "dgxa100"`},
		"other seed":    {"dgxa100", "b", "", `with seed "a"`},
		"not JSON":      {"dgxa100", "a", "{", "parse state file"},
		"bad placement": {"dgxa100", "a", `{"version":1,"machine":"dgxa100","seed":"a","gpus":[` +
			`{"index":0,"migMode":1,"migModePending":1,"gpuInstances":[{"id":8,"profileId":14,"start":1,"size":2}]}` +
			`,{"index":1},{"index":2},{"index":3},{"index":4},{"index":5},{"index":6},{"index":7}]}`,
			"GPU 0: GPU instance 8: invalid placement 1:2"},
		"too few GPUs": {"dgxa100", "a", `{"version":1,"machine":"dgxa100","seed":"a","gpus":[]}`, "has 0 GPUs"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := path
			if tc.content != "" {
				p = filepath.Join(t.TempDir(), "state.json")
				if err := os.WriteFile(p, []byte(tc.content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err := New(tc.machine, WithSeed(tc.seed), WithStateFile(p))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestStateSaveFailureRollsBack(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	m := started(t, "dgxb200", WithStateFile(path))
	d := migGPU(t, m, 0)
	// A directory where the state file was makes the rename of every save fail, even for root.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	oneG := profileByID(t, d, 19)
	if _, ret := d.CreateGpuInstance(&oneG); ret != nvml.ERROR_UNKNOWN {
		t.Fatalf("CreateGpuInstance with an unwritable state file: %v, want ERROR_UNKNOWN", ret)
	}
	if got := m.GpuInstances(0); len(got) != 0 {
		t.Fatalf("failed creation left GPU instances %+v", got)
	}
	if err := m.SetTimeslice(0, 1); err == nil || m.Timeslice(0) != 0 {
		t.Fatalf("SetTimeslice with an unwritable state file: %v, level %d", err, m.Timeslice(0))
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("failed saves left %d entries in the directory", len(entries))
	}
}
