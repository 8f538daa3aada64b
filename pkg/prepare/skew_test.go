package prepare

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// Entries a newer release wrote, in a state or with a device kind this
// release does not know, are left untouched at start and after: not rolled
// back, their specs kept, their unknown fields saved back, their hardware
// not handed to other claims, and they are reported.
func TestForeignEntriesLeftUntouched(t *testing.T) {
	ctx := context.Background()
	opts, node := testOptions(t, Options{})
	d := startTestDriver(t, opts, node)
	suspended, vgpu := allocated("suspended", []string{"gpu-2"}), allocated("vgpu", []string{"gpu-3"})
	if err := prepareOne(t, d, suspended); err != nil {
		t.Fatal(err)
	}
	if err := prepareOne(t, d, vgpu); err != nil {
		t.Fatal(err)
	}
	// What a newer release might have written.
	store := checkpoint.NewFileStore(opts.CheckpointPath)
	cp, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := cp.Get(suspended.UID)
	s.State = "PrepareSuspended"
	s.Unknown = checkpoint.Unknown{"suspendedBy": json.RawMessage(`"v2"`)}
	v, _ := cp.Get(vgpu.UID)
	v.Devices[0].Kind, v.Devices[0].Unknown = "vgpu", checkpoint.Unknown{"vgpuType": json.RawMessage(`"A100-4C"`)}
	if err := store.Save(ctx, cp); err != nil {
		t.Fatal(err)
	}

	d = startTestDriver(t, opts, node)
	if p := d.RecoveryProblems(); len(p) != 2 {
		t.Errorf("recovery problems = %v, want both foreign entries", p)
	}
	for name, tc := range map[string]struct {
		err  error
		want string
	}{
		"prepare of the unknown state":     {err: prepareOne(t, d, suspended), want: `state "PrepareSuspended"`},
		"unprepare of the unknown state":   {err: unprepareOne(t, d, suspended), want: `state "PrepareSuspended"`},
		"unprepare of the unknown kind":    {err: unprepareOne(t, d, vgpu), want: `kind "vgpu"`},
		"the unknown state's GPU":          {err: prepareOne(t, d, allocated("other2", []string{"gpu-2"})), want: "already prepared for claim ns/suspended"},
		"the GPU of the unknown kind":      {err: prepareOne(t, d, allocated("other3", []string{"gpu-3"})), want: "already prepared for claim ns/vgpu"},
		"a healthy GPU is served (no err)": {err: prepareOne(t, d, allocated("other4", []string{"gpu-4"}))},
	} {
		switch {
		case tc.want == "" && tc.err != nil:
			t.Errorf("%s: %v", name, tc.err)
		case tc.want != "" && (tc.err == nil || !strings.Contains(tc.err.Error(), tc.want)):
			t.Errorf("%s: err = %v, want one containing %q", name, tc.err, tc.want)
		}
	}

	// The last prepare saved the checkpoint: the foreign entries are in
	// it as the newer release wrote them.
	after, err := store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := after.Get(suspended.UID)
	if !ok || s.State != "PrepareSuspended" || string(s.Unknown["suspendedBy"]) != `"v2"` {
		t.Errorf("entry in an unknown state after a save = %+v", s)
	}
	v, ok = after.Get(vgpu.UID)
	if !ok || v.Devices[0].Kind != "vgpu" || string(v.Devices[0].Unknown["vgpuType"]) != `"A100-4C"` {
		t.Errorf("entry with an unknown kind after a save = %+v", v)
	}
	specs, err := opts.CDI.ListClaimSpecs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, sp := range specs {
		have[string(sp.Claim.UID)] = true
	}
	if !have[string(suspended.UID)] || !have[string(vgpu.UID)] {
		t.Errorf("specs of foreign entries removed: have %v", have)
	}
}
