package campaign

import (
	"strings"
	"testing"
)

// Each stale-claim step on a calm plugin: a whole-GPU claim deleted under
// its running container is held and its GPU not prepared for a second
// claim, then released when the container ends; one whose container ended
// is released; one reallocated on the node prepares with its new devices.
// Any release while the container runs, or a reallocation that never
// prepares, is a violation.
func TestStaleSteps(t *testing.T) {
	for name, step := range map[string]func(r *run, c *claim){
		"live":        func(r *run, c *claim) { r.staleLive(c) },
		"dead":        func(r *run, c *claim) { c.ended = true; r.deleteClaim(c); r.awaitRelease(c) },
		"reallocated": func(r *run, c *claim) { r.staleReallocated(c) },
	} {
		t.Run(name, func(t *testing.T) {
			r := newRun(t, 1, map[string]bool{})
			r.calm = true
			defer r.cleanup()
			r.start()
			var c *claim
			for c == nil {
				a := r.newActionOfKind(kindGPU)
				r.execute([]*action{a}, false)
				if a.c.state == prepared {
					c = a.c
				}
			}
			r.syncKubelet()
			step(r, c)
			r.syncKubelet()
			if v := append(r.violations, r.check(false)...); len(v) != 0 {
				t.Errorf("violations:\n%s", strings.Join(v, "\n"))
			}
			if err := r.child.Stop(); err != nil {
				t.Error(err)
			}
			r.child = nil
		})
	}
}
