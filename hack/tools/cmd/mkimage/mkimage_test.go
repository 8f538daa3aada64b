package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// readTar returns name -> header and name -> content of a tar file.
func readTar(t *testing.T, r io.Reader) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, data
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		hdrs[h.Name], data[h.Name] = h, b
	}
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "bin", "plugin"), "plugin-binary", 0o700)
	writeFile(t, filepath.Join(dir, "bin", "busybox"), "busybox-binary", 0o755)
	writeFile(t, filepath.Join(dir, "rootfs", "etc", "motd"), "hello", 0o644)

	tests := map[string]struct {
		cfg       config
		wantFiles map[string]string // layer path -> content ("" for a symlink or dir)
	}{
		"generic files go to /usr/bin": {
			cfg:       config{files: []string{filepath.Join(dir, "bin", "plugin")}},
			wantFiles: map[string]string{"usr/bin/plugin": "plugin-binary", "usr/": "", "tmp/": ""},
		},
		"explicit destination": {
			cfg:       config{files: []string{filepath.Join(dir, "bin", "plugin") + ":/pause"}, entrypoint: []string{"/pause"}},
			wantFiles: map[string]string{"pause": "plugin-binary"},
		},
		"busybox applets and rootfs": {
			cfg: config{busybox: filepath.Join(dir, "bin", "busybox"), applets: []string{"sh", "cat"},
				rootfs: filepath.Join(dir, "rootfs")},
			wantFiles: map[string]string{"bin/busybox": "busybox-binary", "bin/sh": "", "bin/cat": "", "etc/motd": "hello"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.cfg.ref = "gdd.local/test:v1"
			tc.cfg.format = "oci"
			tc.cfg.arch = "amd64"
			tc.cfg.out = filepath.Join(t.TempDir(), "image.tar")
			if err := run(tc.cfg); err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(tc.cfg.out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			_, files := readTar(t, f)

			var index struct {
				Manifests []struct {
					Digest      string
					Annotations map[string]string
				}
			}
			if err := json.Unmarshal(files["index.json"], &index); err != nil {
				t.Fatalf("index.json: %v", err)
			}
			if len(index.Manifests) != 1 || index.Manifests[0].Annotations["io.containerd.image.name"] != "gdd.local/test:v1" {
				t.Fatalf("index.json: want one manifest named gdd.local/test:v1, got %s", files["index.json"])
			}
			var manifest struct {
				Layers []struct{ Digest, MediaType string }
			}
			if err := json.Unmarshal(files["blobs/sha256/"+index.Manifests[0].Digest[len("sha256:"):]], &manifest); err != nil {
				t.Fatalf("manifest: %v", err)
			}
			if len(manifest.Layers) != 1 || manifest.Layers[0].MediaType != "application/vnd.oci.image.layer.v1.tar" {
				t.Fatalf("want one uncompressed layer, got %+v", manifest.Layers)
			}
			layer := files["blobs/sha256/"+manifest.Layers[0].Digest[len("sha256:"):]]
			hdrs, content := readTar(t, bytes.NewReader(layer))
			for p, want := range tc.wantFiles {
				h, ok := hdrs[p]
				if !ok {
					t.Errorf("layer lacks %s; has %v", p, keys(hdrs))
					continue
				}
				if h.Typeflag == tar.TypeReg && string(content[p]) != want {
					t.Errorf("%s: content %q, want %q", p, content[p], want)
				}
				if h.Uid != 0 || h.Gid != 0 || h.ModTime.Unix() != 0 {
					t.Errorf("%s: want root-owned with mtime 0, got uid %d gid %d mtime %v", p, h.Uid, h.Gid, h.ModTime)
				}
			}
		})
	}
}

func TestLayerIsReproducible(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a"), "a", 0o755)
	build := func() []byte {
		fs := newTree()
		if err := fs.addFile(filepath.Join(dir, "a"), "/usr/bin/a", 0o755); err != nil {
			t.Fatal(err)
		}
		fs.addSymlink("/bin/b", "a")
		b, err := fs.tar()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if !bytes.Equal(build(), build()) {
		t.Fatal("two builds of the same tree differ")
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	tests := map[string]config{
		"no ref":       {out: "x.tar", format: "oci"},
		"bad format":   {ref: "a/b:c", out: "x.tar", format: "zip"},
		"missing file": {ref: "a/b:c", out: filepath.Join(t.TempDir(), "x.tar"), format: "oci", files: []string{"/does/not/exist"}},
	}
	for name, cfg := range tests {
		t.Run(name, func(t *testing.T) {
			if err := run(cfg); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
