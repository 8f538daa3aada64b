package campaign

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
)

// Starts arm the unhit call points in turn: one whose plugin went away
// before reaching it comes round again after the others, hit ones are
// skipped, and recovery's points come only when every call point is hit.
func TestArmPointTakesUnhitCallPointsInTurn(t *testing.T) {
	r := &run{
		points: []string{"prepare:a", "prepare:b", "unprepare:c", "recover:d"},
		hits:   map[string]int{}, rng: rand.New(rand.NewPCG(1, 2)),
	}
	for i, step := range []struct {
		hit  string // hit before this arming
		want string
	}{
		{"", "prepare:a"},
		{"", "prepare:b"},
		{"prepare:a", "unprepare:c"},
		{"", "prepare:b"}, // round again, a skipped
		{"prepare:b", "unprepare:c"},
		{"unprepare:c", "recover:d"},
	} {
		if step.hit != "" {
			r.hits[step.hit]++
		}
		if got := r.armPoint(); got != step.want {
			t.Fatalf("arming %d (after hits %v): got %q, want %q", i, r.hits, got, step.want)
		}
	}
}

// The sweep at a run's end hits the call points a run left unhit, and the
// coverage rule still fails on a point that no call passes.
func TestCoverageRuleFailsOnUnreachablePoint(t *testing.T) {
	const never = "prepare:never-passed"
	r := newRun(t, 1, map[string]bool{})
	defer r.cleanup()
	r.points = []string{prepare.FaultPrepareCompleted, never}
	r.start()
	r.cover()
	if r.hits[prepare.FaultPrepareCompleted] == 0 {
		t.Errorf("the sweep did not hit the reachable point: hits %v", r.hits)
	}
	gaps := r.coverageGaps()
	want := "fault point " + never + " was never hit in "
	if len(gaps) != 1 || !strings.HasPrefix(gaps[0], want) {
		t.Errorf("coverage gaps = %q, want one, starting %q", gaps, want)
	}
	if len(r.violations) > 0 {
		t.Errorf("the sweep broke invariants: %v", r.violations)
	}
	if r.child != nil {
		if err := r.child.Stop(); err != nil {
			t.Error(err)
		}
		r.child = nil
	}
}
