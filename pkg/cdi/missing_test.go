package cdi

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
)

// A spec names only paths that exist when it is written. On a fresh node
// the UVM nodes appear when nvidia-uvm loads, possibly after the plugin
// started, and a MIG capability node when it is first made; a driver
// upgrade replaces libraries discovered at start. A write while a path is
// missing fails naming it and leaves no spec (the kubelet retries the
// prepare); once the path is there the write succeeds and the spec names it,
// so no container starts without it.
func TestWriteClaimSpecNeedsEveryPath(t *testing.T) {
	for name, tc := range map[string]struct {
		// path is below the driver root, or "" for the device's mount.
		path string
		// late: missing already when the driver files are discovered;
		// otherwise it goes away after discovery.
		late bool
		// what the error calls it.
		what string
	}{
		"UVM node, not loaded at start":       {path: "/dev/nvidia-uvm", late: true, what: "device node /dev/nvidia-uvm"},
		"UVM tools node, not loaded at start": {path: "/dev/nvidia-uvm-tools", late: true, what: "device node /dev/nvidia-uvm-tools"},
		"control node gone since start":       {path: "/dev/nvidiactl", what: "device node /dev/nvidiactl"},
		"GPU node":                            {path: "/dev/nvidia1", late: true, what: "device node /dev/nvidia1"},
		"MIG capability node":                 {path: "/dev/nvidia-caps/nvidia-cap21", late: true, what: "device node /dev/nvidia-caps/nvidia-cap21"},
		"library replaced by an upgrade":      {path: "/usr/lib/x86_64-linux-gnu/libcuda.so." + testDriverVersion, what: "driver library"},
		"binary removed":                      {path: "/usr/bin/nvidia-smi", what: "driver binary /usr/bin/nvidia-smi"},
		"device mount":                        {what: "mount /run/mps"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			r := newFakeRoot(t)
			devices := testDevices()
			full := r.path(strings.Replace(tc.path, "/usr/lib/x86_64-linux-gnu", r.libDir, 1))
			if tc.path == "" {
				full = filepath.Join(t.TempDir(), "mps")
				devices[1].Mounts[0].HostPath = full
				if err := os.Mkdir(full, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			aside := filepath.Join(t.TempDir(), "aside")
			move := func(from, to string) {
				t.Helper()
				if err := os.Rename(from, to); err != nil {
					t.Fatal(err)
				}
			}
			if tc.late {
				move(full, aside)
			}
			files, err := DiscoverDriverFiles(r.dir)
			if err != nil {
				t.Fatalf("DiscoverDriverFiles: %v", err)
			}
			specDir := filepath.Join(t.TempDir(), "cdi")
			if err := os.MkdirAll(specDir, 0o755); err != nil {
				t.Fatal(err)
			}
			w := NewWriter(specDir, r.dir, files)
			if !tc.late {
				move(full, aside)
			}

			_, err = w.WriteClaimSpec(ctx, testClaim, devices)
			if err == nil || !strings.Contains(err.Error(), tc.what) || !strings.Contains(err.Error(), full) || !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("write with %s missing: err = %v, want one naming %q and %s", full, err, tc.what, full)
			}
			testfs.AssertEntries(t, specDir)

			move(aside, full)
			if _, err := w.WriteClaimSpec(ctx, testClaim, devices); err != nil {
				t.Fatalf("write once %s is there: %v", full, err)
			}
			raw, err := os.ReadFile(filepath.Join(specDir, "k8s.gpu.dra.dev-gpu_"+string(testClaimUID)+".json"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(raw), `"`+full+`"`) {
				t.Errorf("the spec written once %s is there does not name it:\n%s", full, raw)
			}
		})
	}
}
