package prepare

import (
	"slices"
	"sync"
)

// keyedMutex hands out one mutex per key (a physical GPU), so work on
// different GPUs runs in parallel while work on one GPU is serialized.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func newKeyedMutex() *keyedMutex {
	return &keyedMutex{locks: map[string]*sync.Mutex{}}
}

// lock takes the mutexes of all keys in sorted order, which rules out
// deadlocks between claims spanning several GPUs, and returns the unlock.
func (k *keyedMutex) lock(keys ...string) func() {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	held := make([]*sync.Mutex, 0, len(keys))
	for _, key := range keys {
		k.mu.Lock()
		m, ok := k.locks[key]
		if !ok {
			m = &sync.Mutex{}
			k.locks[key] = m
		}
		k.mu.Unlock()
		m.Lock()
		held = append(held, m)
	}
	return func() {
		for i := len(held) - 1; i >= 0; i-- {
			held[i].Unlock()
		}
	}
}
