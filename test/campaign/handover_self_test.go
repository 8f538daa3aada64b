package campaign

import (
	"os"
	"strings"
	"testing"
)

// The hand-over check finds an old instance that mutates the node after it
// released the lock, and a hand-over done right passes it, however the old
// instance ends.
func TestHandOverCheckCatchesLateWrite(t *testing.T) {
	for name, tc := range map[string]struct {
		late, kill bool
		want       string
	}{
		"SIGTERM":                            {},
		"SIGKILL":                            {kill: true},
		"old instance saves after it let go": {late: true, want: "mutated at late:checkpoint-saved after it released the lock"},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.late {
				t.Setenv(envLateWrite, "1") // the old instance's environment only
			}
			r := newRun(t, 1, map[string]bool{})
			r.calm = true
			defer r.cleanup()
			r.start() // its canary is a prepared claim
			if err := os.Unsetenv(envLateWrite); err != nil {
				t.Fatal(err)
			}
			r.handOverBy(tc.kill, 1, 1, 1)
			got := strings.Join(r.violations, "\n")
			switch {
			case tc.want == "" && got != "":
				t.Errorf("violations of a clean hand-over:\n%s", got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("hand-over check did not report %q; it reported:\n%s", tc.want, got)
			}
			if err := r.child.Stop(); err != nil {
				t.Error(err)
			}
			r.child = nil
		})
	}
}
