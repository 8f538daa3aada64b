package campaign

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/childproc"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/kubelet"
)

// action is one kubelet call on one claim.
type action struct {
	c       *claim
	prepare bool
	// results
	ids []string
	err error
}

// avoid are the GPUs the scheduler would not pick: lost ones and those
// the running plugin does not publish.
func (r *run) avoid() map[int]bool {
	out := maps.Clone(r.lost)
	maps.Copy(out, r.unpublished)
	return out
}

// newAction allocates a fresh claim with the upstream allocator and
// returns its prepare, or nil when nothing fits. The kind follows the
// armed fault point where that matters.
func (r *run) newAction() *action {
	if a := r.newAdminAction(); a != nil {
		return a
	}
	order := slices.Clone(kinds)
	r.rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	if k := pointKind(r.armed); k != "" {
		order = append([]string{k}, order...)
	}
	return r.newActionOfKind(order...)
}

// newActionOfKind is newAction for the first of the kinds that fits.
func (r *run) newActionOfKind(order ...string) *action {
	for _, kind := range order {
		r.names++
		name, domain := fmt.Sprintf("c%d-%s", r.names, kind), ""
		var obj *resourceapi.ResourceClaim
		if kind == kindChannel {
			if obj, domain = r.newChannelClaim(name); obj == nil {
				continue
			}
		} else {
			obj = newClaim(r.rng, name, kind, r.avoid())
		}
		out, err := r.cluster.Allocate(context.Background(), nodeName, obj)
		if err != nil {
			r.t.Fatalf("allocate %s: %v", obj.Name, err)
		}
		if out == nil {
			continue
		}
		if err := publishClaim(r.dirs.Root, out[0]); err != nil {
			r.t.Fatal(err)
		}
		c := &claim{obj: out[0], kind: kind, state: pendingPrepare, born: r.ops, domain: domain}
		r.claims[c.uid()] = c
		return &action{c: c, prepare: true}
	}
	return nil
}

// pickAction chooses the next call: a kubelet retry of a pending claim, a
// fresh claim, an unprepare or a repeated prepare.
func (r *run) pickAction(busy map[string]bool) *action {
	var pending, done []*claim
	for _, c := range r.sortedClaims() {
		if busy[c.uid()] {
			continue
		}
		if c.state == prepared {
			done = append(done, c)
		} else {
			pending = append(pending, c)
		}
	}
	// Mostly reach the armed point.
	if strings.HasPrefix(r.armed, "unprepare:") && len(done) > 0 && r.rng.IntN(3) > 0 {
		return &action{c: done[r.rng.IntN(len(done))]}
	}
	if strings.HasPrefix(r.armed, "prepare:") && r.rng.IntN(3) > 0 {
		if a := r.newAction(); a != nil {
			return a
		}
	}
	if len(pending) > 0 && r.rng.IntN(2) == 0 {
		c := pending[r.rng.IntN(len(pending))]
		// The kubelet retries a failed prepare, or the pod goes away
		// and it unprepares; an unprepare it retries until it succeeds.
		return &action{c: c, prepare: c.state == pendingPrepare && r.rng.IntN(3) > 0}
	}
	// Fill the node to about a dozen claims, then churn.
	if len(done) == 0 || r.rng.IntN(24) >= len(r.claims) {
		if a := r.newAction(); a != nil {
			return a
		}
	}
	if len(done) == 0 {
		return nil
	}
	c := done[r.rng.IntN(len(done))]
	return &action{c: c, prepare: r.rng.IntN(4) == 0}
}

// batch runs one to four calls at once, each on its own claim, optionally
// killing the plugin at a random moment among them.
func (r *run) batch(randomKill bool) {
	n := 1
	if r.rng.IntN(10) < 3 {
		n = 2 + r.rng.IntN(3)
	}
	actions := r.pickN(map[string]bool{}, n)
	if len(actions) == 0 {
		return
	}
	r.execute(actions, randomKill)
}

// execute makes the calls concurrently, updates the model from the
// answers, checks the invariants, and restarts the plugin if it died.
func (r *run) execute(actions []*action, randomKill bool) {
	var killer *time.Timer
	if randomKill {
		pid := r.child.Pid()
		killer = time.AfterFunc(time.Duration(r.rng.IntN(6000))*time.Microsecond, func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		r.fault("kill-random", "")
	}
	call(r.child.Kubelet, actions)
	died := false
	if killer != nil {
		<-r.child.Done() // the kill comes, if the calls were quicker
		died = true
	} else if slices.ContainsFunc(actions, func(a *action) bool { return a.err != nil }) {
		died = dead(r.child, 300*time.Millisecond)
	} else {
		died = dead(r.child, 0)
	}
	hit := ""
	if died {
		hit = r.takeHit()
	}
	r.record(actions, died)
	r.settle(died, hit)
}

// record updates the model from the answers of the calls; those of a
// plugin that died are excused.
func (r *run) record(actions []*action, died bool) {
	avoid := r.avoid()
	domains := r.liveDomains()
	for _, a := range actions {
		r.ops++
		c := a.c
		excused := died || c.touches(avoid) || c.touches(r.nvmlArmed) || r.nvmlArmed[-1] || !r.publishes(c)
		switch {
		case a.prepare && a.err == nil:
			if c.state == prepared && !slices.Equal(a.ids, c.ids) {
				r.violate("repeated prepare of %s returned %v, first %v", c.obj.Name, a.ids, c.ids)
			}
			if c.kind == kindChannel && c.state != prepared {
				r.preparedChannel(c)
			}
			c.state, c.ids = prepared, a.ids
		case a.prepare:
			if refusedForOtherDomain(c, a.err, domains) {
				r.kinds[tallyChannelRefused]++
			} else if !excused {
				r.violate("prepare of %s (%s on %s) failed: %v", c.obj.Name, c.kind, allocated(c.obj), a.err)
			}
			if c.state != prepared {
				c.state = pendingPrepare
			}
		case a.err == nil:
			delete(r.claims, c.uid())
			r.cluster.Release(c.obj)
		default:
			if !excused {
				r.violate("unprepare of %s (%s on %s) failed: %v", c.obj.Name, c.kind, allocated(c.obj), a.err)
			}
			c.state = pendingUnprepare
		}
	}
}

// settle restarts the plugin if it died, or checks the invariants.
func (r *run) settle(died bool, hit string) {
	if died {
		r.child.Kill() // closes the kubelet's connection
		r.child = nil
		switch {
		case r.rng.IntN(3) == 0:
			r.down(fileFaults[r.rng.IntN(len(fileFaults))]) // what the crash left damaged
		case strings.HasPrefix(hit, "prepare:") && r.bugs[bugDamagedCheckpointMidway]:
			r.down(fileCheckpointCorrupt) // the checkpoint, with a claim half prepared
		}
		r.start()
		return
	}
	for _, v := range r.check(false) {
		r.violate("%s", v)
	}
}

// call makes the kubelet's calls concurrently and waits for their answers.
func call(k *kubelet.Kubelet, actions []*action) {
	var wg sync.WaitGroup
	for _, a := range actions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			if a.prepare {
				a.ids, a.err = k.PrepareOne(ctx, a.c.obj)
			} else {
				a.err = k.UnprepareOne(ctx, a.c.obj)
			}
		}()
	}
	wg.Wait()
}

// finish unprepares every claim, as the kubelet does when all pods are
// gone, and checks that the node is clean.
func (r *run) finish() {
	// No more faults: this is the promise's end state.
	r.bugs, r.calm = map[string]bool{}, true
	if r.armed != "" || len(r.lost) > 0 {
		r.restart("")
	}
	for attempt := 0; attempt < 3 && len(r.claims) > 0; attempt++ {
		if r.armed != "" {
			r.restart("")
			continue
		}
		for _, c := range r.sortedClaims() {
			a := &action{c: c}
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			a.err = r.child.Kubelet.UnprepareOne(ctx, c.obj)
			cancel()
			r.ops++
			if a.err == nil {
				delete(r.claims, c.uid())
				r.cluster.Release(c.obj)
			} else if attempt == 2 {
				r.violate("final unprepare of %s failed: %v", c.obj.Name, a.err)
			}
		}
	}
	if err := r.child.Stop(); err != nil {
		r.violate("graceful stop: %v", err)
	}
	r.child = nil
	for _, v := range r.check(true) {
		r.violate("node not clean at the end: %s", v)
	}
	v, err := readNode(r.dirs, r.uuids)
	if err != nil {
		r.violate("node not clean at the end: %v", err)
		return
	}
	entries := 0
	for range v.cp.All() {
		entries++
	}
	if entries != 0 || len(v.specs) != 0 || len(v.instances) != len(r.static) {
		r.violate("node not clean at the end: %d checkpoint entries, %d specs, %d MIG instances (%d static)", entries, len(v.specs), len(v.instances), len(r.static))
	}
}

// report prints the summary line, the fault tallies and the violations,
// and fails the test on any violation.
func (r *run) report() {
	target := r.target
	fmt.Printf("campaign: %d operations, %d faults, %d invariant violations\n", r.ops, r.faults, len(r.violations))
	for _, p := range r.points {
		fmt.Printf("campaign:   kill at %-28s %d\n", p, r.hits[p])
	}
	for _, k := range slices.Sorted(maps.Keys(r.kinds)) {
		fmt.Printf("campaign:   %-36s %d\n", k, r.kinds[k])
	}
	for _, v := range r.violations {
		fmt.Printf("campaign: violation: %s\n", v)
	}
	if len(r.violations) > 0 {
		// The node's directories go with the test; the plugin's log stays.
		keep := filepath.Join(os.TempDir(), fmt.Sprintf("campaign-%d-plugin.log", r.seed))
		if err := os.WriteFile(keep, []byte(childproc.Log(r.dirs)), 0o644); err == nil {
			fmt.Printf("campaign: plugin log: %s\n", keep)
		}
		r.t.Errorf("%d invariant violations (seed %d; replay: make campaign SEED=%d OPS=%d)", len(r.violations), r.seed, r.seed, target)
	}
	for _, gap := range r.coverageGaps() {
		r.t.Errorf("%s (seed %d)", gap, r.seed)
	}
}

// publishes reports whether the running plugin publishes all the claim's
// devices: one allocated before a restart may have lost a device to a
// leaked MIG instance (reported as a leak), and then fails to prepare.
func (r *run) publishes(c *claim) bool {
	for _, res := range c.obj.Status.Allocation.Devices.Results {
		if !fromChannelPool(res) && !r.published[res.Device] {
			return false
		}
	}
	return true
}
