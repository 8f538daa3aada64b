package campaign

import (
	"context"
	"fmt"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// step runs one step of the campaign: operations, with or without a fault.
func (r *run) step() {
	if r.armed != "" && r.rng.IntN(5) > 0 {
		r.batch(false) // mostly let the plugin reach its fault point first
		return
	}
	r.syncKubelet()
	switch x := r.rng.IntN(100); {
	case x < 10:
		r.staleStep() // falls back to a batch while the plugin is armed
	case x < 58:
		r.batch(false)
	case x < 62:
		r.endDomain()
	case x < 70:
		r.batch(true)
	case x < 80:
		r.restart(fileFaults[r.rng.IntN(len(fileFaults))])
	case x < 85:
		r.toggleLoss()
	case x < 92:
		r.nvmlError()
	case x < 93:
		r.restart("")
	case x < 95:
		r.handOver()
	case r.bugs[bugReallocate]:
		r.reallocate()
	default:
		r.batch(false)
	}
}

// toggleLoss makes a GPU fall off the bus while the plugin runs, or brings
// a lost one back.
func (r *run) toggleLoss() {
	cmd := nvmlCommand{Lost: map[int]bool{}}
	if len(r.lost) == 0 {
		g := r.rng.IntN(len(r.uuids))
		cmd.Lost[g] = true
	} else {
		for g := range r.lost {
			cmd.Lost[g] = false
		}
	}
	if err := sendControl(r.dirs, cmd, r.child.Done()); err != nil {
		r.violate("control: %v", err)
		return
	}
	for g, lost := range cmd.Lost {
		if lost {
			r.lost[g] = true
			r.fault("gpu-lost", fmt.Sprintf("(%d)", g))
		} else {
			delete(r.lost, g)
		}
	}
}

// nvmlError makes one NVML call fail on a GPU during the next batch.
func (r *run) nvmlError() {
	f := nvmlFaults[r.rng.IntN(len(nvmlFaults))]
	g := r.rng.IntN(len(r.uuids))
	if live := r.sortedClaims(); len(live) > 0 && r.rng.IntN(2) == 0 {
		if gs := live[r.rng.IntN(len(live))].gpus(); len(gs) > 0 {
			g = gs[0] // a GPU in use, so that unprepares meet the error too
		}
	}
	if err := sendControl(r.dirs, nvmlCommand{Inject: []injectedError{{Method: f.method, GPU: g, Ret: f.ret, Times: 1}}}, r.child.Done()); err != nil {
		r.violate("control: %v", err)
		return
	}
	r.fault("nvml-error", fmt.Sprintf(":%s(%d)", f.method, g))
	r.nvmlArmed[g] = true
	r.batch(false)
	if r.child != nil && !dead(r.child, 0) {
		if err := sendControl(r.dirs, nvmlCommand{Clear: true}, r.child.Done()); err == nil {
			r.nvmlArmed = map[int]bool{}
		}
	}
}

// reallocate gives a claim whose prepare failed a new allocation, after
// the kubelet's unprepare, and prepares it again.
func (r *run) reallocate() {
	// Best a claim the plugin completed although the kubelet saw the
	// prepare fail (cut off after the completion was recorded).
	var c *claim
	cp, err := loadCheckpoint(r.dirs)
	if err != nil {
		cp = checkpoint.New()
	}
	for _, cl := range r.sortedClaims() {
		if cl.state != pendingPrepare {
			continue
		}
		if e, ok := cp.Get(cl.obj.UID); c == nil || (ok && e.State == checkpoint.PrepareCompleted) {
			c = cl
		}
	}
	if c == nil {
		r.batch(false)
		return
	}
	// As the kubelet does before a claim can be allocated anew (its pod is
	// gone first), it unprepares the claim; a changed allocation of a claim
	// the plugin still holds is refused by design (item 7, test/node
	// TestRePrepareWithAnotherAllocation). A successful unprepare releases
	// the old allocation; a failed one is retried before anything else.
	r.execute([]*action{{c: c}}, false)
	if r.claims[c.uid()] != nil {
		return
	}
	fresh := c.obj.DeepCopy()
	fresh.Status.Allocation = nil
	out, err := r.cluster.Allocate(context.Background(), nodeName, fresh)
	if err != nil {
		r.t.Fatal(err)
	}
	if out == nil {
		return
	}
	r.claims[c.uid()] = c
	c.state = pendingPrepare
	if err := publishClaim(r.dirs.Root, out[0]); err != nil {
		r.t.Fatal(err)
	}
	r.fault("reallocated", "("+c.obj.Name+")")
	c.obj = out[0]
	r.execute([]*action{{c: c, prepare: true}}, false)
}
