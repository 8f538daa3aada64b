package testfs

import (
	"os"
	"path/filepath"
	"testing"
)

type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Fatal(...any)          { r.failed = true }

func TestAssertEntries(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"b", "a"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := map[string]struct {
		names []string
		fails bool
	}{
		"exactly, in any order": {names: []string{"b", "a"}},
		"one more on disk":      {names: []string{"a"}, fails: true},
		"one missing":           {names: []string{"a", "b", "c"}, fails: true},
		"none wanted":           {fails: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &recorder{}
			AssertEntries(r, dir, tc.names...)
			if r.failed != tc.fails {
				t.Errorf("AssertEntries(%v) failed=%v, want %v", tc.names, r.failed, tc.fails)
			}
		})
	}
	r := &recorder{}
	if AssertEntries(r, t.TempDir()); r.failed {
		t.Error("AssertEntries of an empty dir with no names failed")
	}
}
