package v1beta1

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// hostileDir holds configs built to break the decoder: deep nesting, huge
// numbers, case variants of field names, duplicate keys, YAML aliases and
// tags, invalid UTF-8, oversized documents. _want.json says what each must
// give; the webhook's tests run the same corpus through the handler.
const hostileDir = "testdata/hostile"

// caseDeadline bounds each config: a bound against hangs and blow-ups, not
// a timing measurement (BenchmarkDecodeWorstCase measures).
const caseDeadline = 2 * time.Second

type hostileWant struct {
	// Rejected maps a file to a substring of its error: the field path
	// where a field is at fault.
	Rejected map[string]string `json:"rejected"`
	// Accepted maps a file accepted on purpose to the reason.
	Accepted map[string]string `json:"accepted"`
}

func readHostileCorpus(t testing.TB) (map[string][]byte, hostileWant) {
	t.Helper()
	var want hostileWant
	data, err := os.ReadFile(filepath.Join(hostileDir, "_want.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(hostileDir, "*"))
	if err != nil {
		t.Fatal(err)
	}
	corpus := map[string][]byte{}
	for _, f := range files {
		name := filepath.Base(f)
		if strings.HasPrefix(name, "_") {
			continue
		}
		if corpus[name], err = os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
		_, rejected := want.Rejected[name]
		_, accepted := want.Accepted[name]
		if rejected == accepted {
			t.Errorf("%s: list it in _want.json under rejected or accepted, once", name)
		}
	}
	for name := range want.Rejected {
		if corpus[name] == nil {
			t.Errorf("_want.json lists %s, which is not in %s", name, hostileDir)
		}
	}
	for name := range want.Accepted {
		if corpus[name] == nil {
			t.Errorf("_want.json lists %s, which is not in %s", name, hostileDir)
		}
	}
	return corpus, want
}

// TestHostileCorpus runs every hostile config through DecodeDefaultValidate:
// each is rejected with the expected message (naming the field where one is
// at fault) or accepted on purpose, never panics, and finishes within
// caseDeadline.
func TestHostileCorpus(t *testing.T) {
	corpus, want := readHostileCorpus(t)
	for _, name := range slices.Sorted(maps.Keys(corpus)) {
		t.Run(name, func(t *testing.T) {
			type result struct {
				cfg Config
				err error
			}
			done := make(chan result, 1)
			go func() {
				defer func() {
					if p := recover(); p != nil {
						done <- result{err: fmt.Errorf("panic: %v", p)}
					}
				}()
				cfg, err := DecodeDefaultValidate(corpus[name])
				done <- result{cfg, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(caseDeadline):
				t.Fatalf("DecodeDefaultValidate did not return within %v", caseDeadline)
			}
			if r.err != nil && strings.HasPrefix(r.err.Error(), "panic: ") {
				t.Fatal(r.err)
			}
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
