package prepare

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// What the checkpoint file holds for a claim when its preparation starts
// its work: a whole GPU's only lasting effect beside its CDI spec cannot be
// undone, so its PrepareStarted costs no save; a MIG device's instance must
// be findable after a crash, so its PrepareStarted is on disk first.
func TestPrepareStartedSavedOnlyWhenWorkOutlivesACrash(t *testing.T) {
	tests := map[string]struct {
		device    func(*Engine) string
		wantSaved bool
	}{
		"whole GPU":   {device: func(*Engine) string { return "gpu-0" }, wantSaved: false},
		"dynamic MIG": {device: func(d *Engine) string { return firstDynamicMIG(t, d, 0) }, wantSaved: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var onDisk *checkpoint.PreparedClaim
			var d *Engine
			var hookErr error
			d = newTestDriver(t, func(point string) {
				if point != FaultPrepareStarted {
					return
				}
				cp, err := checkpoint.NewFileStore(d.opts.CheckpointPath).Load(context.Background())
				if err != nil {
					hookErr = err
					return
				}
				onDisk, _ = cp.Get("c-uid")
			})
			if err := prepareOne(t, d, allocated("c", []string{tc.device(d)})); err != nil {
				t.Fatal(err)
			}
			if hookErr != nil {
				t.Fatal(hookErr)
			}
			switch {
			case tc.wantSaved && (onDisk == nil || onDisk.State != checkpoint.PrepareStarted):
				t.Errorf("checkpoint file at %s holds %+v, want the claim in PrepareStarted", FaultPrepareStarted, onDisk)
			case !tc.wantSaved && onDisk != nil:
				t.Errorf("checkpoint file at %s holds %+v, want no record (no save before the work)", FaultPrepareStarted, onDisk)
			}
			cl := d.PreparedClaims()
			if len(cl) != 1 || cl[0].State != checkpoint.PrepareCompleted {
				t.Errorf("prepared claims = %+v, want one PrepareCompleted", cl)
			}
		})
	}
}

// A crash while a spec is written leaves its temporary file, which no
// record names when the claim's PrepareStarted was not saved: the next
// start removes it, and leaves complete specs and other vendors' files.
func TestRecoveryRemovesInterruptedSpecWrites(t *testing.T) {
	opts, node := testOptions(t, Options{})
	d := startTestDriver(t, opts, node)
	if err := prepareOne(t, d, allocated("kept", []string{"gpu-0"})); err != nil {
		t.Fatal(err)
	}
	specDir := filepath.Join(filepath.Dir(opts.CheckpointPath), "cdi")
	kept := "k8s.gpu.dra.dev-gpu_kept-uid.json"
	other := ".nvidia.com-gpu.json.tmp-7"
	for _, name := range []string{".k8s.gpu.dra.dev-gpu_crashed-uid.json.tmp-123", "." + kept + ".tmp-9", other} {
		if err := os.WriteFile(filepath.Join(specDir, name), []byte(`{"cdiVersion":`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	startTestDriver(t, opts, node)
	testfs.AssertEntries(t, specDir, kept, other)
}
