package prepare

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// A wedged engine (a checkpoint save that never returns, an NVML call
// that hangs under a GPU lock) answers nothing the kubelet asks while the
// sockets still answer an empty call. The probes ask Stalled instead: the
// age of the oldest operation in flight, and of a pass through the locks
// every prepare takes, so a wedge shows even while no prepare waits on it.

// inflight tracks the engine's operations in progress by start time.
type inflight struct {
	mu   sync.Mutex
	next uint64
	ops  map[uint64]operation
	pass bool // a lock pass runs
}

type operation struct {
	what  string
	since time.Time
}

// begin records an operation; end removes it.
func (f *inflight) begin(what string) (end func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ops == nil {
		f.ops = map[uint64]operation{}
	}
	id := f.next
	f.next++
	f.ops[id] = operation{what: what, since: time.Now()}
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.ops, id)
	}
}

// oldest returns the operation in flight longest; false when none is.
func (f *inflight) oldest() (operation, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var old operation
	found := false
	for _, op := range f.ops {
		if !found || op.since.Before(old.since) {
			old, found = op, true
		}
	}
	return old, found
}

// Stalled returns an error naming the oldest operation of the engine that
// has been in flight longer than bound: a prepare, unprepare or stale
// release of a claim, a checkpoint save, or a pass through the engine's
// locks, which it starts when none runs. It never blocks, so a probe
// calling it answers at once; a bound above the longest legitimate
// operation (a MIG reconfiguration takes seconds) and the wait of a claim
// queued behind one keeps a busy engine live.
func (d *Engine) Stalled(bound time.Duration) error {
	d.startLockPass()
	op, ok := d.inflight.oldest()
	if !ok {
		return nil
	}
	if age := time.Since(op.since); age > bound {
		return fmt.Errorf("%s in flight for %s, longer than %s", op.what, age.Round(time.Second), bound)
	}
	return nil
}

// startLockPass takes and releases, one at a time, the locks a prepare
// takes: the save lock, the checkpoint lock and each published GPU's lock.
// One pass runs at a time; it counts as an operation in flight.
func (d *Engine) startLockPass() {
	d.inflight.mu.Lock()
	if d.inflight.pass {
		d.inflight.mu.Unlock()
		return
	}
	d.inflight.pass = true
	d.inflight.mu.Unlock()
	end := d.inflight.begin("a pass through the engine's locks")
	go func() {
		defer func() {
			end()
			d.inflight.mu.Lock()
			d.inflight.pass = false
			d.inflight.mu.Unlock()
		}()
		waitFor(&d.saveMu)
		waitFor(&d.mu)
		keys := make([]string, 0, len(d.published))
		for i := range d.published {
			keys = append(keys, lockKey(&d.published[i]))
		}
		slices.Sort(keys)
		for _, key := range slices.Compact(keys) {
			d.locks.lock(key)()
		}
	}()
}

// waitFor waits until l is free: it takes it and lets it go at once.
func waitFor(l sync.Locker) {
	l.Lock()
	l.Unlock()
}
