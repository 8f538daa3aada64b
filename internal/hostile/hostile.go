// Package hostile runs a corpus of hostile inputs (api/gpu/v1beta1's
// testdata/hostile) through the code under test: it reads the corpus with
// what each input must give, and bounds each run so that a hang or a panic
// fails its case instead of the whole test binary.
package hostile

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Want is a corpus's _want.json.
type Want struct {
	// Rejected maps a file to a substring of its error: the field path
	// where a field is at fault.
	Rejected map[string]string `json:"rejected"`
	// Accepted maps a file accepted on purpose to the reason.
	Accepted map[string]string `json:"accepted"`
}

// Read returns the files of the corpus in dir by name, and its _want.json;
// it fails t unless every file is listed exactly once and every listed file
// exists.
func Read(t testing.TB, dir string) (map[string][]byte, Want) {
	t.Helper()
	var want Want
	data, err := os.ReadFile(filepath.Join(dir, "_want.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*"))
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
	for _, listed := range []map[string]string{want.Rejected, want.Accepted} {
		for name := range listed {
			if corpus[name] == nil {
				t.Errorf("_want.json lists %s, which is not in %s", name, dir)
			}
		}
	}
	return corpus, want
}

// Call returns f's result, failing t (from the calling goroutine) if f
// panics or has not returned within deadline; what names f in the failure.
func Call[T any](t testing.TB, deadline time.Duration, what string, f func() T) T {
	t.Helper()
	type result struct {
		v     T
		panic any
	}
	done := make(chan result, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- result{panic: p}
			}
		}()
		done <- result{v: f()}
	}()
	select {
	case r := <-done:
		if r.panic != nil {
			t.Fatalf("%s panicked: %v", what, r.panic)
		}
		return r.v
	case <-time.After(deadline):
		t.Fatalf("%s did not return within %v", what, deadline)
	}
	var zero T // not reached: Fatalf ends the test's goroutine
	return zero
}
