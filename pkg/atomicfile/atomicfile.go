// Package atomicfile replaces, renames and removes files so that a crash at
// any point leaves either the old or the new state on disk, never a partial
// file: write a temporary file in the same directory, fsync it, rename it over
// the target and fsync the directory.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// tempInfix separates the target's base name from the random suffix in the
// names of temporary files. Temporary files start with a dot and end in the
// random suffix, so tools that select files by extension (the CDI cache reads
// only *.json and *.yaml) never pick up a half-written file.
const tempInfix = ".tmp-"

// Option changes how WriteFile behaves.
type Option func(*options)

type options struct {
	verify func(tmpPath string) error
	noSync bool
}

func collect(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Volatile is for files on a file system that a reboot erases (tmpfs,
// ramfs): the fsyncs of the file and its directory are left out, since
// there is no disk for them to reach. The temporary file and the rename
// stay, so other processes and a restart after a crash of this process
// still see the old or the new content, never a partial file: a process
// crash loses nothing the kernel was given.
func Volatile() Option {
	return func(o *options) { o.noSync = true }
}

// WithVerify makes WriteFile call verify with the path of the fully written
// and synced temporary file before renaming it into place. An error from
// verify aborts the write: the temporary file is removed, the target is left
// untouched and WriteFile returns the error.
func WithVerify(verify func(tmpPath string) error) Option {
	return func(o *options) { o.verify = verify }
}

// WriteFile atomically replaces path with data, creating it with permission
// perm if it does not exist. The directory of path must exist. Concurrent
// calls for the same path do not corrupt it (the last rename wins), but the
// caller is responsible for ordering them.
func WriteFile(path string, data []byte, perm os.FileMode, opts ...Option) (err error) {
	o := collect(opts)

	dir := filepath.Dir(path)
	tmp, err := CreateTemp(path)
	if err != nil {
		return err
	}
	tmpPath := tmp.Name()
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmpPath)
		}
	}()

	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("set mode of %s: %w", tmpPath, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmpPath, err)
	}
	if !o.noSync {
		if err := tmp.Sync(); err != nil {
			return fmt.Errorf("sync %s: %w", tmpPath, err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmpPath, err)
	}
	if o.verify != nil {
		if err := o.verify(tmpPath); err != nil {
			return fmt.Errorf("verify new content of %s: %w", path, err)
		}
	}
	if err := os.Rename(tmpPath, path); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	if o.noSync {
		return nil
	}
	if err := syncDir(dir); err != nil {
		// The new content is in place; only its durability is in doubt.
		// Do not remove anything, but report the failure.
		return fmt.Errorf("sync directory of %s: %w", path, err)
	}
	return nil
}

// CreateTemp creates a temporary file beside path, named as WriteFile names
// its own (IsTemp, RemoveTemps find it). The caller closes and removes it.
func CreateTemp(path string) (*os.File, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+tempInfix+"*")
	if err != nil {
		return nil, fmt.Errorf("create temporary file for %s: %w", path, err)
	}
	return tmp, nil
}

// Rename renames oldPath to newPath and fsyncs the directories involved, so
// the rename survives a crash.
func Rename(oldPath, newPath string) error {
	if err := os.Rename(oldPath, newPath); err != nil {
		return err
	}
	oldDir, newDir := filepath.Dir(oldPath), filepath.Dir(newPath)
	if err := syncDir(newDir); err != nil {
		return fmt.Errorf("sync directory %s: %w", newDir, err)
	}
	if oldDir != newDir {
		if err := syncDir(oldDir); err != nil {
			return fmt.Errorf("sync directory %s: %w", oldDir, err)
		}
	}
	return nil
}

// Remove removes path and fsyncs its directory (not with Volatile). A path
// that does not exist is not an error, so Remove is idempotent. WithVerify
// does not apply.
func Remove(path string, opts ...Option) error {
	if err := os.Remove(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if collect(opts).noSync {
		return nil
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("sync directory of %s: %w", path, err)
	}
	return nil
}

// IsTemp reports whether name (a base name) is a temporary file that
// WriteFile creates while replacing some file in the same directory.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, tempInfix)
}

// RemoveTemps removes temporary files that an interrupted WriteFile for path
// left behind. Call it only while no WriteFile for path is in progress, for
// example when a component starts.
func RemoveTemps(path string) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	matches, err := filepath.Glob(filepath.Join(dir, "."+escapeGlob(base)+tempInfix+"*"))
	if err != nil {
		return fmt.Errorf("list temporary files of %s: %w", path, err)
	}
	var errs []error
	for _, m := range matches {
		if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// escapeGlob quotes the characters filepath.Match treats specially.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// syncDir fsyncs a directory so that entries created, renamed or removed in
// it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	syncErr := d.Sync()
	closeErr := d.Close()
	return errors.Join(syncErr, closeErr)
}
