package cdi

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
)

// Once a spec was validated whole, later specs with the same driver mounts
// are validated without them: what differs per claim is still checked by
// the CDI library, and a spec whose mounts differ is validated whole again.
func TestValidationAfterTheFirstSpec(t *testing.T) {
	ctx := context.Background()
	_, specDir, w := setup(t)
	if _, err := w.WriteClaimSpec(ctx, testClaim, testDevices()); err != nil {
		t.Fatal(err)
	}
	v := &w.(*writer).validator
	if !v.valid || len(v.mounts) == 0 {
		t.Fatalf("validator after the first spec: valid=%v, %d mounts; want the driver mounts kept", v.valid, len(v.mounts))
	}
	bad := testDevices()[:1]
	bad[0].Env = []string{"NOT-AN-ASSIGNMENT"}
	other := ClaimInfo{UID: "other-uid", Namespace: "ns", Name: "other"}
	if _, err := w.WriteClaimSpec(ctx, other, bad); err == nil || !strings.Contains(err.Error(), "invalid environment variable") {
		t.Fatalf("WriteClaimSpec of an invalid device after a valid spec = %v, want the CDI library's rejection", err)
	}
	testfs.AssertEntries(t, specDir, "k8s.gpu.dra.dev-gpu_"+string(testClaimUID)+".json")

	// Mounts that differ from the validated ones are checked too.
	spec, _, err := w.(*writer).builder.build(other, testDevices())
	if err != nil {
		t.Fatal(err)
	}
	if !v.knows(spec.ContainerEdits.Mounts) {
		t.Fatal("validator does not know the mounts of the spec it validated")
	}
	spec.ContainerEdits.Mounts = append(spec.ContainerEdits.Mounts, &cdispec.Mount{HostPath: "/x", ContainerPath: "relative"})
	if v.knows(spec.ContainerEdits.Mounts) {
		t.Error("validator treats a changed mount list as validated")
	}
}

// The file the validator reads is a temporary file of the spec, which
// RemoveTemps removes should a crash leave it.
func TestValidationFileIsATemp(t *testing.T) {
	specPath := filepath.Join(t.TempDir(), "k8s.gpu.dra.dev-gpu_u.json")
	f, err := atomicfile.CreateTemp(specPath)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if !atomicfile.IsTemp(filepath.Base(f.Name())) || !strings.HasPrefix(filepath.Base(f.Name()), "."+specFilePrefix) {
		t.Errorf("validation file %s is not named as a temporary spec file", f.Name())
	}
	w := NewWriter(filepath.Dir(specPath), "/", nil)
	if err := w.RemoveTemps(context.Background()); err != nil {
		t.Fatal(err)
	}
	testfs.AssertEntries(t, filepath.Dir(specPath))
}
