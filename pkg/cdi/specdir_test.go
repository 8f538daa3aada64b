package cdi

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
)

// The spec directory is created and looked at once; one removed later (an
// operator cleaning up, a tmpfs remounted) is created again by the next
// write.
func TestWriteClaimSpecRecreatesRemovedDir(t *testing.T) {
	ctx := context.Background()
	_, specDir, w := setup(t)
	if _, err := w.WriteClaimSpec(ctx, testClaim, testDevices()); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(specDir); err != nil {
		t.Fatal(err)
	}
	ids, err := w.WriteClaimSpec(ctx, testClaim, testDevices())
	if err != nil {
		t.Fatalf("write after the spec directory was removed: %v", err)
	}
	testfs.AssertEntries(t, specDir, "k8s.gpu.dra.dev-gpu_"+string(testClaimUID)+".json")
	inject(t, specDir, ids...)
}

// Specs on a tmpfs are written without fsyncs: volatileFS tells a tmpfs
// from the test's own directory's file system.
func TestVolatileFS(t *testing.T) {
	shm, err := os.MkdirTemp("/dev/shm", "cdi-test-")
	if err != nil {
		t.Skipf("no /dev/shm to test a tmpfs with: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(shm) })
	if v, err := volatileFS(shm); err != nil || !v {
		t.Errorf("volatileFS(%s) = %v, %v; want true", shm, v, err)
	}
	if _, err := volatileFS(filepath.Join(shm, "missing")); err == nil {
		t.Error("volatileFS of a missing directory gave no error")
	}
	// A writer over the tmpfs writes without fsyncs, one over the
	// checkout's disk with them.
	r, diskDir, onDisk := setup(t)
	files, err := DiscoverDriverFiles(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	onTmpfs := NewWriter(filepath.Join(shm, "cdi"), r.dir, files)
	for _, w := range []Writer{onTmpfs, onDisk} {
		if _, err := w.WriteClaimSpec(context.Background(), testClaim, testDevices()); err != nil {
			t.Fatal(err)
		}
	}
	if len(onTmpfs.(*writer).fileOpts) == 0 {
		t.Error("writer over a tmpfs fsyncs its specs")
	}
	if v, err := volatileFS(diskDir); err != nil {
		t.Fatal(err)
	} else if !v && len(onDisk.(*writer).fileOpts) != 0 {
		t.Errorf("writer over %s, not a tmpfs, does not fsync its specs", diskDir)
	}
}
