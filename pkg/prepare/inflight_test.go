package prepare

import (
	"strings"
	"testing"
	"time"
)

// Stalled sees a wedge where no prepare waits on it yet (a hung NVML call
// under a GPU's lock, a hung save under the save lock) through its pass
// through the locks, names what is stuck, and keeps a busy engine live
// under a bound above the wait.
func TestStalled(t *testing.T) {
	tests := map[string]struct {
		hold func(d *Engine) (unlock func())
		want string // "" passes with a tight bound
	}{
		"idle": {hold: func(*Engine) func() { return func() {} }},
		"a GPU's lock held": {
			hold: func(d *Engine) func() { return d.locks.lock(lockKey(&d.published[len(d.published)-1])) },
			want: "a pass through the engine's locks",
		},
		"the save lock held": {
			hold: func(d *Engine) func() { d.saveMu.Lock(); return d.saveMu.Unlock },
			want: "a pass through the engine's locks",
		},
		"a save in flight": {
			hold: func(d *Engine) func() { return d.inflight.begin("checkpoint save") },
			want: "checkpoint save",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := newTestDriver(t, nil)
			unlock := tc.hold(d)
			defer unlock()
			if err := d.Stalled(time.Hour); err != nil {
				t.Errorf("Stalled under an hour's bound: %v", err)
			}
			if tc.want == "" {
				// The pass over free locks ends; nothing else is in flight.
				for d.passRunning() {
					time.Sleep(time.Millisecond)
				}
				if op, ok := d.inflight.oldest(); ok {
					t.Errorf("in flight on an idle engine: %+v", op)
				}
				return
			}
			err := d.Stalled(time.Nanosecond)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Stalled = %v, want it to name %q", err, tc.want)
			}
		})
	}
}

func (d *Engine) passRunning() bool {
	d.inflight.mu.Lock()
	defer d.inflight.mu.Unlock()
	return d.inflight.pass
}
