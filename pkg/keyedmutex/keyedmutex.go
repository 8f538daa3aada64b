// Package keyedmutex serializes work per key (a GPU UUID) while work on
// other keys runs in parallel.
//
// k8s.io/utils/keymutex does not fit: its hashed mutexes share one mutex
// among several keys, so taking the locks of two keys that collide would
// deadlock, and a claim spanning several GPUs takes several locks.
package keyedmutex

import (
	"slices"
	"sync"
)

// Mutex hands out one mutex per key. The zero value is ready to use. The
// mutexes are kept for the life of the Mutex: keys are the node's devices,
// a small and bounded set.
type Mutex struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// Lock takes the mutexes of all keys in sorted order, which rules out
// deadlocks between callers holding several keys, and returns the unlock.
// A key given twice is locked once.
func (k *Mutex) Lock(keys ...string) (unlock func()) {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	held := make([]*sync.Mutex, 0, len(keys))
	for _, key := range keys {
		m := k.get(key)
		m.Lock()
		held = append(held, m)
	}
	return func() {
		for i := len(held) - 1; i >= 0; i-- {
			held[i].Unlock()
		}
	}
}

func (k *Mutex) get(key string) *sync.Mutex {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.locks == nil {
		k.locks = map[string]*sync.Mutex{}
	}
	m, ok := k.locks[key]
	if !ok {
		m = &sync.Mutex{}
		k.locks[key] = m
	}
	return m
}
