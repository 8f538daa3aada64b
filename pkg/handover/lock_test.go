package handover

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A second instance waits while the first holds the lock, is told who
// holds it, and takes over (recording itself) once the first lets go.
func TestAcquireWaitsForHolder(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	first, err := Acquire(ctx, dir, Owner{PodName: "ns/old", PodUID: "uid-old"}, nil)
	if err != nil {
		t.Fatalf("first Acquire: %v", err)
	}
	if o, err := ReadOwner(dir); err != nil || o.PodUID != "uid-old" || o.PID != os.Getpid() {
		t.Fatalf("owner while the first holds = %+v, %v; want uid-old, pid %d", o, err, os.Getpid())
	}

	waited := make(chan Owner, 1)
	got := make(chan error, 1)
	var second *Lock
	go func() {
		l, err := Acquire(ctx, dir, Owner{PodName: "ns/new", PodUID: "uid-new"}, func(h Owner) { waited <- h })
		second = l
		got <- err
	}()
	select {
	case h := <-waited:
		if h.PodUID != "uid-old" {
			t.Errorf("waiting for %+v, want the holder uid-old", h)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second Acquire never reported waiting")
	}
	select {
	case err := <-got:
		t.Fatalf("second Acquire returned (%v) while the first holds the lock", err)
	case <-time.After(time.Second):
	}
	first.Release(ctx)
	first.Release(ctx) // twice is harmless
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("second Acquire after release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second Acquire still waiting after the first released")
	}
	defer second.Release(ctx)
	if o, err := ReadOwner(dir); err != nil || o.PodUID != "uid-new" || !strings.Contains(o.String(), "ns/new") {
		t.Fatalf("owner after the hand-over = %+v, %v; want uid-new", o, err)
	}
}

// A waiter gives up when its context ends, with an error naming the lock.
func TestAcquireHonorsContext(t *testing.T) {
	dir := t.TempDir()
	held, err := Acquire(context.Background(), dir, Owner{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = Acquire(ctx, dir, Owner{}, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), filepath.Join(dir, LockFile)) {
		t.Fatalf("Acquire = %v, want a deadline error naming the lock file", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Acquire returned after %v, long after its deadline", d)
	}
}

// A lock file that cannot be opened is an error, not a wait.
func TestAcquireUnusableDir(t *testing.T) {
	_, err := Acquire(context.Background(), filepath.Join(t.TempDir(), "missing"), Owner{}, nil)
	if err == nil || !strings.Contains(err.Error(), "open hand-over lock") {
		t.Fatalf("Acquire on a missing directory = %v, want an open error", err)
	}
}
