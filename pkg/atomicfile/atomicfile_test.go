package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
)

func TestWriteFile(t *testing.T) {
	errVerify := errors.New("rejected")
	tests := map[string]struct {
		existing []byte // nil: no file before the write
		opts     []Option
		wantErr  error
		want     []byte
	}{
		"create": {
			want: []byte("new"),
		},
		"replace": {
			existing: []byte("old content that is longer"),
			want:     []byte("new"),
		},
		"replace, volatile": {
			existing: []byte("old content that is longer"),
			opts:     []Option{Volatile()},
			want:     []byte("new"),
		},
		"volatile, verify rejects": {
			existing: []byte("old"),
			opts:     []Option{Volatile(), WithVerify(func(string) error { return errVerify })},
			wantErr:  errVerify,
			want:     []byte("old"),
		},
		"verify accepts": {
			existing: []byte("old"),
			opts: []Option{WithVerify(func(tmp string) error {
				data, err := os.ReadFile(tmp)
				if err != nil {
					return err
				}
				if string(data) != "new" {
					return errors.New("temporary file does not hold the new content")
				}
				return nil
			})},
			want: []byte("new"),
		},
		"verify rejects and keeps the old file": {
			existing: []byte("old"),
			opts:     []Option{WithVerify(func(string) error { return errVerify })},
			wantErr:  errVerify,
			want:     []byte("old"),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "state.json")
			if tc.existing != nil {
				if err := os.WriteFile(path, tc.existing, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := WriteFile(path, []byte("new"), 0o640, tc.opts...)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("WriteFile error = %v, want %v", err, tc.wantErr)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(tc.want) {
				t.Errorf("content = %q, want %q", got, tc.want)
			}
			testfs.AssertEntries(t, dir, "state.json")
			if tc.wantErr == nil {
				fi, err := os.Stat(path)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode().Perm() != 0o640 {
					t.Errorf("mode = %v, want %v", fi.Mode().Perm(), os.FileMode(0o640))
				}
			}
		})
	}
}

func TestWriteFileMissingDir(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "state.json")
	if err := WriteFile(path, []byte("x"), 0o600); err == nil {
		t.Fatal("WriteFile into a missing directory succeeded")
	}
}

func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state[1].json")
	for _, name := range []string{
		".state[1].json.tmp-123", // leftover of path: removed
		".state[1].json.tmp-abc", // leftover of path: removed
		".other.json.tmp-1",      // leftover of another file: kept
		"state[1].json",          // the file itself: kept
	} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := RemoveTemps(path); err != nil {
		t.Fatalf("RemoveTemps: %v", err)
	}
	testfs.AssertEntries(t, dir, ".other.json.tmp-1", "state[1].json")
}

func TestIsTemp(t *testing.T) {
	tests := map[string]bool{
		".checkpoint.json.tmp-12345": true,
		"checkpoint.json":            false,
		".hidden":                    false,
		"x.tmp-1":                    false,
	}
	for name, want := range tests {
		if got := IsTemp(name); got != want {
			t.Errorf("IsTemp(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestRemoveAndRename(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.WriteFile(a, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Rename(a, b); err != nil {
		t.Fatalf("Rename: %v", err)
	}
	testfs.AssertEntries(t, dir, "b")
	if err := Remove(b); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := Remove(b); err != nil {
		t.Fatalf("Remove of a missing file: %v", err)
	}
	testfs.AssertEntries(t, dir)
}
