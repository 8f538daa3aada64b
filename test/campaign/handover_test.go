package campaign

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/childproc"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/kubelet"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/handover"
)

// The journal lines a plugin process writes around the hand-over lock:
// stepOwns when it opens the machine, right after it took the lock (from
// there on it owns the node), stepReleased when it returns from serving,
// right after it released the lock (from there on it must not mutate).
const (
	stepOwns     = "handover:owns"
	stepReleased = "handover:released"
)

// handOver replaces the plugin as a rolling update of the DaemonSet does
// (maxSurge 1): a second instance starts while the first serves (with
// calls in flight, and armed with a fault point if the start was), it
// registers without the lock; the kubelet sends it new calls, which wait
// at its gate, while calls sent to the old one just before are still in
// flight; then the old one is stopped (SIGTERM, sometimes SIGKILL). The
// new one must take over everything the old one did, answer its waiting
// calls, and the old one must have mutated nothing once the new one owned
// the node.
func (r *run) handOver() {
	r.handOverBy(r.rng.IntN(4) == 0, r.rng.IntN(3), r.rng.IntN(4), r.rng.IntN(3))
}

// Tallies of the hand-overs, in the summary.
const (
	tallyHandOverArmed = "hand-over, old one armed"
	tallyHandOverDied  = "hand-over, old one died at its point"
	tallyHandOverKill  = "hand-over by SIGKILL"
)

// handOverBy is handOver with up to nEarly calls sent to the old instance
// before the new one registers, nWaiting to the new one, and nLate to the
// old one just before it is stopped, by SIGKILL if kill.
func (r *run) handOverBy(kill bool, nEarly, nWaiting, nLate int) {
	old := r.child
	how := "sigterm"
	if kill {
		how = "sigkill"
	}
	before, err := childproc.Journal(r.dirs)
	if err != nil {
		r.t.Fatal(err)
	}
	r.fault("hand-over", "("+how+")")
	if kill {
		r.kinds[tallyHandOverKill]++
	}
	if r.armed != "" {
		r.kinds[tallyHandOverArmed]++
	}
	busy := map[string]bool{}
	early := r.pickN(busy, nEarly)
	earlyDone := callAsync(old.Kubelet, early)
	pod := childproc.Pod{UID: fmt.Sprintf("00000000-0000-4000-8000-%012d", r.kinds["hand-over"])}
	var neu *childproc.Child
	neu, err = childproc.StartPod(r.dirs, pod, startTimeout)
	if err != nil {
		<-earlyDone
		r.violate("hand-over: the new instance did not register beside the old one: %v: %s", err, lastLine(r.dirs))
		died := dead(old, 0)
		hit := ""
		if died {
			hit = r.takeHit()
		}
		r.record(early, died)
		r.settle(died, hit)
		return
	}
	// The kubelet sends new calls to the newest instance.
	waiting := r.pickN(busy, nWaiting)
	waitingDone := callAsync(neu.Kubelet, waiting)
	// Calls it sent the old one just before: in flight when that one stops.
	late := r.pickN(busy, nLate)
	lateDone := callAsync(old.Kubelet, late)
	var stopErr error
	if kill {
		<-time.After(time.Duration(r.rng.IntN(6000)) * time.Microsecond)
		old.Kill()
	} else {
		stopErr = old.Stop()
	}
	<-earlyDone
	<-lateDone
	hit := r.takeHit() // the old one may have died at its fault point
	if hit != "" {
		r.kinds[tallyHandOverDied]++
	}
	if stopErr != nil && hit == "" {
		r.violate("hand-over: the old instance: %v", stopErr)
	}
	// Calls of the old one may be refused (draining) or cut off (killed).
	r.record(early, true)
	r.record(late, true)
	<-waitingDone
	r.child, r.armed = neu, ""
	died := dead(neu, 0)
	if died {
		r.violate("hand-over: the new instance exited: %s", lastLine(r.dirs))
	}
	r.record(waiting, died)
	for _, v := range checkHandOver(r.dirs, len(before), old.Pid(), neu.Pid()) {
		r.violate("hand-over: %s", v)
	}
	if died {
		r.settle(true, r.takeHit())
		return
	}
	r.adopt()
}

// coverHandOver makes every run (the short one of make check too) hand
// over at random at least once, and once with the old instance armed at
// a call's fault point and calls in flight that mostly reach it, so that
// it dies mid-operation while the new one waits.
func (r *run) coverHandOver() {
	if r.kinds["hand-over"] == 0 {
		r.handOver()
	}
	if r.kinds[tallyHandOverDied] == 0 {
		req := required(r.points)
		r.force = req[r.rng.IntN(len(req))]
		r.restart("")
		r.handOverBy(false, 2, 1, 2)
	}
}

// pickN picks up to n calls on claims not busy yet.
func (r *run) pickN(busy map[string]bool, n int) []*action {
	var out []*action
	for range n {
		a := r.pickAction(busy)
		if a == nil {
			break
		}
		busy[a.c.uid()] = true
		out = append(out, a)
	}
	return out
}

// callAsync makes the calls in the background; the channel closes once
// all are answered.
func callAsync(k *kubelet.Kubelet, actions []*action) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		call(k, actions)
	}()
	return done
}

// checkHandOver checks, once the old instance has exited, that the two
// never both mutated the node: every step the new one journaled comes
// after it took the lock, every step of the old one before it released
// the lock and before the new one took it, and the lock names the new one.
// Only the journal's steps from index from on, those of the hand-over,
// count: a PID may be reused in a long run.
func checkHandOver(dirs pluginrun.Dirs, from, oldPID, newPID int) []string {
	steps, err := journalUntilOwned(dirs, newPID)
	if err != nil {
		return []string{err.Error()}
	}
	steps = steps[min(from, len(steps)):]
	var out []string
	owns, released := -1, false
	for i, s := range steps {
		switch {
		case s.PID == newPID && s.Point == stepOwns:
			if owns < 0 {
				owns = i
			}
		case s.PID == oldPID && s.Point == stepReleased:
			released = true
		case s.PID == newPID && owns < 0:
			out = append(out, fmt.Sprintf("the new instance (pid %d) mutated at %s before it took the lock", newPID, s.Point))
		case s.PID == oldPID && released:
			out = append(out, fmt.Sprintf("the old instance (pid %d) mutated at %s after it released the lock", oldPID, s.Point))
		case s.PID == oldPID && owns >= 0:
			out = append(out, fmt.Sprintf("the old instance (pid %d) mutated at %s after the new one (pid %d) took the lock", oldPID, s.Point, newPID))
		}
	}
	if owns < 0 {
		out = append(out, fmt.Sprintf("the new instance (pid %d) never took the lock", newPID))
	}
	if o, err := handover.ReadOwner(dirs.PluginData); err != nil || o.PID != newPID {
		out = append(out, fmt.Sprintf("the lock names %+v (%v), want the new instance (pid %d)", o, err, newPID))
	}
	return out
}

// journalUntilOwned returns the journal once it shows that pid took the
// lock, or as it is after startTimeout: with no call waiting for it, the
// new instance takes the lock in its own time.
func journalUntilOwned(dirs pluginrun.Dirs, pid int) ([]childproc.Step, error) {
	deadline := time.Now().Add(startTimeout)
	for {
		steps, err := childproc.Journal(dirs)
		if err != nil || time.Now().After(deadline) || slices.Contains(steps, childproc.Step{PID: pid, Point: stepOwns}) {
			return steps, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// envLateWrite makes a plugin process save the checkpoint once more after
// it released the lock, as soon as another instance owns the node: the
// bug checkHandOver must catch (TestHandOverCheckCatchesLateWrite).
const envLateWrite = "GPU_DRA_CAMPAIGN_LATE_WRITE"

// afterServe is the end of a plugin process that serveErr ended: it
// journals stepReleased and, with envLateWrite, misbehaves as an instance
// whose goroutine outlives the lock.
func afterServe(root string, journal func(string), serveErr error) error {
	journal(stepReleased)
	if serveErr != nil || os.Getenv(envLateWrite) == "" {
		return serveErr
	}
	dirs, err := pluginrun.NewDirs(root)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(startTimeout)
	for ; time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if o, err := handover.ReadOwner(dirs.PluginData); err == nil && o.PID != os.Getpid() {
			break
		}
	}
	store := checkpoint.NewFileStore(checkpointPath(dirs))
	cp, err := store.Load(ctxBackground())
	if err != nil {
		return err
	}
	journal("late:checkpoint-saved")
	return store.Save(ctxBackground(), cp)
}
