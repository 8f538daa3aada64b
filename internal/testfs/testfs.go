// Package testfs holds assertions on the files a test leaves behind.
package testfs

import (
	"os"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// AssertEntries fails t unless dir holds exactly the named entries, in any
// order: no more (a leaked temp file, an orphaned spec), no fewer.
func AssertEntries(t testing.TB, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{}
	for _, e := range entries {
		got = append(got, e.Name())
	}
	want := slices.Sorted(slices.Values(names))
	if want == nil {
		want = []string{}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("files in %s (-want +got):\n%s", dir, diff)
	}
}
