package v1beta1

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/internal/hostile"
)

// hostileDir holds configs built to break the decoder: deep nesting, huge
// numbers, case variants of field names, duplicate keys, YAML aliases and
// tags, invalid UTF-8, oversized documents. _want.json says what each must
// give; the webhook's tests run the same corpus through the handler.
const hostileDir = "testdata/hostile"

// caseDeadline bounds each config: a bound against hangs and blow-ups, not
// a timing measurement (BenchmarkDecodeWorstCase measures).
const caseDeadline = 2 * time.Second

// TestHostileCorpus runs every hostile config through DecodeDefaultValidate:
// each is rejected with the expected message (naming the field where one is
// at fault) or accepted on purpose, never panics, and finishes within
// caseDeadline.
func TestHostileCorpus(t *testing.T) {
	corpus, want := hostile.Read(t, hostileDir)
	for _, name := range slices.Sorted(maps.Keys(corpus)) {
		t.Run(name, func(t *testing.T) {
			type result struct {
				cfg Config
				err error
			}
			r := hostile.Call(t, caseDeadline, "DecodeDefaultValidate", func() result {
				cfg, err := DecodeDefaultValidate(corpus[name])
				return result{cfg, err}
			})
			if reason, ok := want.Accepted[name]; ok {
				if r.err != nil {
					t.Errorf("rejected with %v; want it accepted (%s)", r.err, reason)
				}
				return
			}
			if r.err == nil {
				t.Fatalf("accepted as %#v; want an error with %q", r.cfg, want.Rejected[name])
			}
			if r.cfg != nil {
				t.Errorf("returned %#v along with its error", r.cfg)
			}
			if !strings.Contains(r.err.Error(), want.Rejected[name]) {
				t.Errorf("error %q does not contain %q", r.err, want.Rejected[name])
			}
		})
	}
}
