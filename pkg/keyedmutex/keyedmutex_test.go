package keyedmutex

import (
	"sync"
	"testing"
	"time"
)

// TestLockSerializesPerKey: a key is held by one caller at a time, while
// other keys stay free.
func TestLockSerializesPerKey(t *testing.T) {
	var k Mutex
	unlock := k.Lock("gpu-0")
	got := make(chan string, 2)
	go func() { u := k.Lock("gpu-0"); got <- "gpu-0"; u() }()
	go func() { u := k.Lock("gpu-1"); got <- "gpu-1"; u() }()
	select {
	case key := <-got:
		if key != "gpu-1" {
			t.Fatalf("%s locked while held", key)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("another key waited for a held one")
	}
	select {
	case key := <-got:
		t.Fatalf("%s locked while held", key)
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("key not handed on after unlock")
	}
}

// TestLockSeveralKeysDoesNotDeadlock: callers taking overlapping key sets
// in opposite orders, with duplicates, all finish.
func TestLockSeveralKeysDoesNotDeadlock(t *testing.T) {
	var k Mutex
	sets := [][]string{{"a", "b", "c"}, {"c", "b", "a"}, {"b", "b", "a"}, {"c"}}
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			unlock := k.Lock(sets[i%len(sets)]...)
			time.Sleep(10 * time.Microsecond)
			unlock()
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("deadlock between overlapping key sets")
	}
}

// TestLockForgetsUnusedKeys: a key nobody holds or waits for takes no
// memory, so keys may be claim UIDs, which never come back.
func TestLockForgetsUnusedKeys(t *testing.T) {
	var k Mutex
	unlock := k.Lock("a", "b")
	waiting := make(chan func())
	go func() { waiting <- k.Lock("b", "c") }()
	time.Sleep(50 * time.Millisecond) // let it wait for b
	unlock()
	(<-waiting)()
	if n := len(k.locks); n != 0 {
		t.Errorf("%d locks kept after every key was unlocked: %v", n, k.locks)
	}
}
