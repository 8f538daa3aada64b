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

// Mutex hands out one mutex per key. The zero value is ready to use. A
// key's mutex lives while someone holds or waits for it, so keys may come
// from an unbounded set (claim UIDs) as well as from the node's devices.
type Mutex struct {
	mu    sync.Mutex
	locks map[string]*entry
}

// entry is a key's mutex and how many callers hold or wait for it.
type entry struct {
	sync.Mutex
	refs int
}

// Lock takes the mutexes of all keys in sorted order, which rules out
// deadlocks between callers holding several keys, and returns the unlock.
// A key given twice is locked once.
func (k *Mutex) Lock(keys ...string) (unlock func()) {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	held := make([]*entry, 0, len(keys))
	for _, key := range keys {
		e := k.acquire(key)
		e.Lock()
		held = append(held, e)
	}
	return func() {
		for i := len(held) - 1; i >= 0; i-- {
			held[i].Unlock()
			k.release(keys[i], held[i])
		}
	}
}

func (k *Mutex) acquire(key string) *entry {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.locks == nil {
		k.locks = map[string]*entry{}
	}
	e, ok := k.locks[key]
	if !ok {
		e = &entry{}
		k.locks[key] = e
	}
	e.refs++
	return e
}

func (k *Mutex) release(key string, e *entry) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(k.locks, key)
	}
}
