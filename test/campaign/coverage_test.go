package campaign

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
)

// Coverage: every fault point on the call paths (prepare:*, unprepare:*)
// must be hit in every run. Random arming alone left that to luck: a start
// armed one point at random, among unhit ones that included recovery's
// (which fire only when the node's state calls for them, so they stayed
// unhit and kept being drawn), and a plugin killed or restarted for another
// fault before a call reached its point took the point with it. Seeds 3, 7
// and 11 of 500 operations each missed a different point. Now the call
// points are armed in turn until each is hit, and a run that still left one
// unhit ends with a sweep that arms it and makes the call that passes it.

// coverTries bounds the sweep's attempts at one point: a point no call
// reaches fails the coverage rule after them.
const coverTries = 3

// required are the points of the call paths; recovery's fire only when the
// node's state calls for their step and are counted, not required
// (test/crash TestRecoveryCrash kills at each of them deterministically).
func required(points []string) []string {
	var out []string
	for _, p := range points {
		if !strings.HasPrefix(p, "recover:") {
			out = append(out, p)
		}
	}
	return out
}

// unhitRequired are the required points not hit yet, in list order.
func (r *run) unhitRequired() []string {
	var out []string
	for _, p := range required(r.points) {
		if r.hits[p] == 0 {
			out = append(out, p)
		}
	}
	return out
}

// armPoint is the fault point a start arms. While required points are
// unhit: the next of them in turn, from where the last arming stopped, so
// a point whose plugin died or was restarted before reaching it comes
// round again after the others. Then any point, those not hit yet first.
func (r *run) armPoint() string {
	req := required(r.points)
	for i := range req {
		p := req[(r.armCursor+i)%len(req)]
		if r.hits[p] == 0 {
			r.armCursor = (r.armCursor + i + 1) % len(req)
			return p
		}
	}
	pts := slices.DeleteFunc(slices.Clone(r.points), func(p string) bool { return r.hits[p] > 0 })
	if len(pts) == 0 {
		pts = r.points
	}
	return pts[r.rng.IntN(len(pts))]
}

// coverageGaps is the coverage rule: the required points never hit.
func (r *run) coverageGaps() []string {
	var out []string
	for _, p := range r.unhitRequired() {
		out = append(out, fmt.Sprintf("fault point %s was never hit in %d operations", p, r.ops))
	}
	return out
}

// cover arms each required point still unhit and makes the call that
// passes it, up to coverTries times, so that coverage holds for any seed.
// A point that no call passes stays unhit and fails the rule.
func (r *run) cover() {
	for _, p := range r.unhitRequired() {
		for try := 0; try < coverTries && r.hits[p] == 0; try++ {
			r.t.Logf("op %d: sweep: %s unhit, armed again (try %d of %d)", r.ops, p, try+1, coverTries)
			r.force = p
			r.restart("")
			if r.armed != p {
				continue // it fired in recovery (a hit) or the start was cut short
			}
			r.reach(p)
		}
	}
}

// reach makes the call that passes point p on the running plugin armed
// with it: the unprepare of a prepared claim (one is prepared first if
// none is), or the prepare of a fresh claim (a MIG device for the MIG step),
// unpreparing prepared claims while none fits.
func (r *run) reach(p string) {
	if strings.HasPrefix(p, "unprepare:") {
		if r.preparedClaim() == nil {
			if a := r.newAction(); a != nil {
				r.execute([]*action{a}, false)
			}
		}
		if c := r.preparedClaim(); c != nil && r.armed == p {
			r.execute([]*action{{c: c}}, false)
		}
		return
	}
	order := slices.Clone(kinds)
	if k := pointKind(p); k != "" {
		order = []string{k}
	}
	for r.armed == p {
		if a := r.newActionOfKind(order...); a != nil {
			r.execute([]*action{a}, false)
			return
		}
		c := r.preparedClaim()
		if c == nil {
			return // nothing to make room with
		}
		r.execute([]*action{{c: c}}, false) // room for the fresh claim
		if r.claims[c.uid()] != nil {
			return // the unprepare failed; the next try starts over
		}
	}
}

// pointKind is the only kind whose prepare passes fault point p, "" when
// every kind's does.
func pointKind(p string) string {
	return map[string]string{
		prepare.FaultPrepareMIGCreated: kindMIG, prepare.FaultPrepareVFIOBound: kindVFIO,
		prepare.FaultPrepareIMEXDomainRecorded: kindChannel,
	}[p]
}

// preparedClaim is the first prepared claim by name, or nil.
func (r *run) preparedClaim() *claim {
	for _, c := range r.sortedClaims() {
		if c.state == prepared {
			return c
		}
	}
	return nil
}
