package requesttranslation

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// queueYAML is a Queue with the given spec and, unless "", the
// translation's annotation.
func queueYAML(spec, recorded string) string {
	meta := "metadata: {name: team, futureMeta: 1}"
	if recorded != "" {
		meta = "metadata: {name: team, futureMeta: 1, annotations: {gpu.dra.dev/translated: '" + recorded + "'}}"
	}
	return "apiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\n" + meta + "\nspec: {reclaimable: true, futureSpec: x, " + spec + "}\n"
}

func TestQueue(t *testing.T) {
	const capEntry = "spec.capability[deviceclass/gpu.dra.dev]"
	tests := map[string]struct {
		in, old string // old: "" on create
		want    string // the Queue after the patch; "": unchanged
		ops     int    // number of patch operations, when want is set
		field   string // a refusal naming it
	}{
		"capability as nvidia.com/gpu": {
			in:   queueYAML("capability: {cpu: 8, nvidia.com/gpu: 4}", ""),
			want: queueYAML("capability: {cpu: 8, nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: '4'}", capEntry), ops: 2,
		},
		"all three lists, MIG by its name": {
			in: queueYAML("capability: {nvidia.com/gpu: '8', nvidia.com/mig-1g.10gb: 7}, deserved: {nvidia.com/gpu: 4}, guarantee: {resource: {nvidia.com/gpu: 1}}", ""),
			want: queueYAML("capability: {nvidia.com/gpu: '8', nvidia.com/mig-1g.10gb: 7, deviceclass/gpu.dra.dev: '8', deviceclass/mig-1g.10gb.gpu.dra.dev: '7'}, deserved: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: '4'}, guarantee: {resource: {nvidia.com/gpu: 1, deviceclass/gpu.dra.dev: '1'}}",
				"spec.capability[deviceclass/gpu.dra.dev], spec.capability[deviceclass/mig-1g.10gb.gpu.dra.dev], spec.deserved[deviceclass/gpu.dra.dev], spec.guarantee.resource[deviceclass/gpu.dra.dev]"),
			ops: 5,
		},
		"whole number written in milli": {
			in:   queueYAML("capability: {nvidia.com/gpu: 4000m}", ""),
			want: queueYAML("capability: {nvidia.com/gpu: 4000m, deviceclass/gpu.dra.dev: '4'}", capEntry), ops: 2,
		},
		"no GPU names":             {in: queueYAML("capability: {cpu: 8, example.com/nic: 2}", "")},
		"the user's own equal key": {in: queueYAML("capability: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: 4}", "")},
		"only deviceclass keys":    {in: queueYAML("capability: {deviceclass/gpu.dra.dev: 4, memory.deviceclass/mps.gpu.dra.dev: 80Gi}", "")},
		"translated again":         {in: queueYAML("capability: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: '4'}", capEntry)},
		"update: nvidia.com/gpu changes": {
			in:   queueYAML("capability: {nvidia.com/gpu: 6, deviceclass/gpu.dra.dev: '4'}", capEntry),
			old:  queueYAML("capability: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: '4'}", capEntry),
			want: queueYAML("capability: {nvidia.com/gpu: 6, deviceclass/gpu.dra.dev: '6'}", capEntry), ops: 1,
		},
		"update: nvidia.com/gpu removed": {
			in:   queueYAML("capability: {cpu: 1, deviceclass/gpu.dra.dev: '4'}", capEntry),
			old:  queueYAML("capability: {cpu: 1, nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: '4'}", capEntry),
			want: "apiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\nmetadata: {name: team, futureMeta: 1, annotations: {}}\nspec: {reclaimable: true, futureSpec: x, capability: {cpu: 1}}\n", ops: 2,
		},
		"update: annotation dropped by the user's tool": {
			in:   queueYAML("capability: {nvidia.com/gpu: 6, deviceclass/gpu.dra.dev: '4'}", ""),
			old:  queueYAML("capability: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: '4'}", capEntry),
			want: queueYAML("capability: {nvidia.com/gpu: 6, deviceclass/gpu.dra.dev: '6'}", capEntry), ops: 2,
		},
		"update: the user takes the derived key over": {
			in:   queueYAML("capability: {deviceclass/gpu.dra.dev: '8'}", capEntry),
			old:  queueYAML("capability: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: '4'}", capEntry),
			want: "apiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\nmetadata: {name: team, futureMeta: 1, annotations: {}}\nspec: {reclaimable: true, futureSpec: x, capability: {deviceclass/gpu.dra.dev: '8'}}\n", ops: 1,
		},
		"update: the user's key is never the translation's": {
			in:  queueYAML("capability: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: 4}, deserved: {deviceclass/gpu.dra.dev: 2}", ""),
			old: queueYAML("capability: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: 4}, deserved: {deviceclass/gpu.dra.dev: 2}", ""),
		},
		"a stale annotation is removed": {
			in:   queueYAML("capability: {cpu: 1}", capEntry),
			want: "apiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\nmetadata: {name: team, futureMeta: 1, annotations: {}}\nspec: {reclaimable: true, futureSpec: x, capability: {cpu: 1}}\n", ops: 1,
		},
		"the user's different key":       {in: queueYAML("capability: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: 8}", ""), field: "spec.capability[deviceclass/gpu.dra.dev]"},
		"the user's different deserved":  {in: queueYAML("deserved: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: 2}", ""), field: "spec.deserved[deviceclass/gpu.dra.dev]"},
		"update: the user edits the key": {in: queueYAML("capability: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: '8'}", capEntry), old: queueYAML("capability: {nvidia.com/gpu: 4, deviceclass/gpu.dra.dev: '4'}", capEntry), field: "spec.capability[deviceclass/gpu.dra.dev]"},
		"fraction":                       {in: queueYAML("guarantee: {resource: {nvidia.com/gpu: 1500m}}", ""), field: "spec.guarantee.resource[nvidia.com/gpu]"},
		"negative":                       {in: queueYAML("deserved: {nvidia.com/gpu: -1}", ""), field: "spec.deserved[nvidia.com/gpu]"},
		"capability 0":                   {in: queueYAML("capability: {nvidia.com/gpu: 0}", ""), field: "spec.capability[nvidia.com/gpu]"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := fromYAML(t, tc.in)
			var old []byte
			if tc.old != "" {
				old = fromYAML(t, tc.old)
			}
			res, err := Queue(in, old, annotation, testOpts.Classes)
			if tc.field != "" {
				var e *Error
				if !errors.As(err, &e) || e.Field != tc.field {
					t.Fatalf("error %v, want a refusal naming %s", err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want == "" {
				if len(res.Patch) != 0 {
					t.Fatalf("patch %+v, want none", res.Patch)
				}
				return
			}
			if len(res.Patch) != tc.ops {
				t.Errorf("%d operations %+v, want %d", len(res.Patch), res.Patch, tc.ops)
			}
			got := apply(t, in, res.Patch)
			if diff := cmp.Diff(generic(t, fromYAML(t, want)), got); diff != "" {
				t.Errorf("translated Queue (-want +got):\n%s", diff)
			}
			// Idempotent: the translated Queue, updated unchanged, changes no more.
			out, _ := json.Marshal(got)
			again, err := Queue(out, out, annotation, testOpts.Classes)
			if err != nil || len(again.Patch) != 0 {
				t.Errorf("translating again: %+v, %v; want no patch", again.Patch, err)
			}
			if again, err := Queue(out, nil, annotation, testOpts.Classes); err != nil || len(again.Patch) != 0 {
				t.Errorf("creating the translated Queue again: %+v, %v; want no patch", again.Patch, err)
			}
		})
	}
}

func TestQueueDecodeError(t *testing.T) {
	_, err := Queue([]byte(`{"spec":{"capability":{"nvidia.com/gpu":"four"}}}`), nil, annotation, testOpts.Classes)
	if !errors.Is(err, ErrDecode) || !strings.Contains(err.Error(), "Queue") {
		t.Errorf("error %v, want ErrDecode naming the Queue", err)
	}
}
