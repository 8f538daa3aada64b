package simhooks

import (
	"sync"

	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
)

// SaveWedge hangs the plugin's checkpoint saves while on, as a hung disk
// does (POST EventPath?hangsave=true): the engine's probe check must turn
// the plugin unready and, in time, get it restarted. Like Machine.Hang it
// lives in the process only: a restarted plugin is not wedged.
type SaveWedge struct {
	mu   sync.Mutex
	hung chan struct{} // nil: saves go on
}

// Hang makes the next saves block until Release.
func (w *SaveWedge) Hang() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hung == nil {
		w.hung = make(chan struct{})
	}
}

// Release lets the blocked saves go on.
func (w *SaveWedge) Release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hung != nil {
		close(w.hung)
		w.hung = nil
	}
}

// FaultHook returns the engine's FaultHook: next (if set), and a block at
// prepare.FaultCheckpointSaving while the wedge is on.
func (w *SaveWedge) FaultHook(next func(string)) func(string) {
	return func(point string) {
		if next != nil {
			next(point)
		}
		if point != prepare.FaultCheckpointSaving {
			return
		}
		w.mu.Lock()
		hung := w.hung
		w.mu.Unlock()
		if hung != nil {
			<-hung
		}
	}
}
