package prepare

import (
	"context"
	"testing"

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
