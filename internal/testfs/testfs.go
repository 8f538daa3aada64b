// Package testfs holds assertions on the files a test leaves behind, and
// fake files of the host (/proc, sockets of dead processes) that the code
// under test reads.
package testfs

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// WriteProcess writes what pkg/podattribution reads of process pid in a
// fake /proc at root: its cgroup file and a stat file that says it started
// start clock ticks after boot.
func WriteProcess(t testing.TB, root string, pid int, start uint64, cgroup string) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Fields 1 to 22 of proc(5) stat, with a command name that has spaces
	// and parentheses, as one may.
	stat := fmt.Sprintf("%d (my (proc) x) S 1 %d %d 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 %d 1000000 100\n", pid, pid, pid, start)
	for name, content := range map[string]string{"cgroup": cgroup, "stat": stat} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// DeadSocket leaves a unix socket file at path that nobody listens on, as
// a killed process does: connecting to it is refused.
func DeadSocket(t testing.TB, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	_ = ln.Close()
}
