package devicemodel_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// TestReserve: the GPUs not shown keep their whole GPU (and nothing else);
// the slice count stays, so only the slices of GPUs whose showing changed
// differ.
func TestReserve(t *testing.T) {
	n := simnode.New(t, "dgxh100", "node-1")
	full := n.Resources.Pools["node-1"].Slices
	got := devicemodel.Reserve(n.Resources, "node-1", map[string]bool{"gpu-1": true}).Pools["node-1"].Slices
	if len(got) != len(full) {
		t.Fatalf("%d slices, want the full model's %d", len(got), len(full))
	}
	for i := range full {
		want := names(full[i].Devices)
		if i != 0 && i != 2 { // slice 0 holds the counter sets, slice 2 GPU 1's devices
			want = want[:1]
		}
		if have := names(got[i].Devices); !slices.Equal(have, want) {
			t.Errorf("slice %d: %v, want %v", i, have, want)
		}
	}
	if len(full[3].Devices) < 2 {
		t.Error("Reserve changed its input")
	}
}

// TestUseOf: a MIG device or share partitions its GPU, a whole GPU makes
// it busy only; devices of other pools or unknown names count for nothing.
func TestUseOf(t *testing.T) {
	n := simnode.New(t, "dgxh100", "node-1")
	u := devicemodel.UseOf(n.Resources, "node-1", map[string]bool{"gpu-0": true, "gpu-1-ts": true, "gpu-2-mig-1g10gb-6": true, "gpu-9": true})
	if want := []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}; !slices.Equal(u.GPUs, want) {
		t.Errorf("GPUs %v, want %v", u.GPUs, want)
	}
	for gpu, want := range map[string][2]bool{"gpu-0": {false, true}, "gpu-1": {true, true}, "gpu-2": {true, true}, "gpu-3": {false, false}} {
		if got := [2]bool{u.Partitioned[gpu], u.Busy[gpu]}; got != want {
			t.Errorf("%s: partitioned, busy = %v, want %v", gpu, got, want)
		}
	}
}

// TestReservePolicyValidation: reserve.spareGPUs is named when out of range.
func TestReservePolicyValidation(t *testing.T) {
	for policy, wantErr := range map[string]string{
		"reserve: {spareGPUs: 1}":                    "",
		"reserve: {spareGPUs: 0}":                    "",
		"reserve: {spareGPUs: -1}":                   "reserve.spareGPUs: -1 is not in 0..64",
		"reserve: {spareGPUs: 65}":                   "reserve.spareGPUs: 65 is not in 0..64",
		"reserve: {spares: 1}":                       `unknown field "spares"`,
		"reserve: {spareGPUs: 1, holdSeconds: 5}":    "",
		"reserve: {spareGPUs: 1, holdSeconds: -1}":   "reserve.holdSeconds: -1 is not in 0..3600 (0: 30)",
		"reserve: {spareGPUs: 1, holdSeconds: 3601}": "reserve.holdSeconds: 3601 is not in 0..3600",
	} {
		file := filepath.Join(t.TempDir(), "policy.yaml")
		if err := os.WriteFile(file, []byte(policy), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := devicemodel.LoadPolicy(file)
		if wantErr == "" && err != nil || wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)) {
			t.Errorf("%s: %v, want %q", policy, err, wantErr)
		}
	}
}
