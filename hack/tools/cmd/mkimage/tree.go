package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"time"
)

// entry is one file system object of the image layer.
type entry struct {
	typ    byte // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	mode   int64
	src    string // host file for regular files
	target string // link target for symlinks
}

// tree is the in-memory description of the single image layer, keyed by absolute path.
type tree struct {
	entries map[string]entry
}

func newTree() *tree {
	return &tree{entries: map[string]entry{"/": {typ: tar.TypeDir, mode: 0o755}}}
}

func (t *tree) ensureDir(p string, mode int64) {
	p = path.Clean("/" + p)
	if p == "/" {
		return
	}
	t.ensureDir(path.Dir(p), 0o755)
	if _, ok := t.entries[p]; !ok {
		t.entries[p] = entry{typ: tar.TypeDir, mode: mode}
	}
}

func (t *tree) addFile(src, dest string, mode int64) error {
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("add file %s as %s: %w", src, dest, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("add file %s as %s: not a regular file", src, dest)
	}
	dest = path.Clean("/" + dest)
	t.ensureDir(path.Dir(dest), 0o755)
	t.entries[dest] = entry{typ: tar.TypeReg, mode: mode, src: src}
	return nil
}

func (t *tree) addSymlink(dest, target string) {
	dest = path.Clean("/" + dest)
	t.ensureDir(path.Dir(dest), 0o755)
	t.entries[dest] = entry{typ: tar.TypeSymlink, mode: 0o777, target: target}
}

// addDir copies the directory tree under root into the layer at dest. Regular
// files, directories and symlinks are kept with their permission bits; other
// file types (devices, sockets) are skipped.
func (t *tree) addDir(root, dest string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("copy %s: %w", root, err)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		target := path.Join(dest, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("copy %s: %w", p, err)
		}
		perm := int64(info.Mode().Perm())
		switch {
		case d.IsDir():
			t.ensureDir(target, perm)
			if e := t.entries[path.Clean("/"+target)]; e.typ == tar.TypeDir {
				e.mode = perm
				t.entries[path.Clean("/"+target)] = e
			}
		case info.Mode().IsRegular():
			return t.addFile(p, target, perm)
		case info.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("copy %s: %w", p, err)
			}
			t.addSymlink(target, link)
		}
		return nil
	})
}

// tar renders the layer as an uncompressed tar with sorted entries, root
// ownership and a fixed modification time (SOURCE_DATE_EPOCH, default 0), so the
// same inputs always give the same layer digest.
func (t *tree) tar() ([]byte, error) {
	mtime := time.Unix(0, 0)
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
		sec, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", v, err)
		}
		mtime = time.Unix(sec, 0)
	}
	paths := make([]string, 0, len(t.entries))
	for p := range t.entries {
		if p != "/" {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := t.entries[p]
		hdr := &tar.Header{Typeflag: e.typ, Name: p[1:], Mode: e.mode, ModTime: mtime, Format: tar.FormatPAX}
		switch e.typ {
		case tar.TypeDir:
			hdr.Name += "/"
		case tar.TypeSymlink:
			hdr.Linkname = e.target
		case tar.TypeReg:
			data, err := os.ReadFile(e.src)
			if err != nil {
				return nil, fmt.Errorf("read %s: %w", e.src, err)
			}
			hdr.Size = int64(len(data))
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
