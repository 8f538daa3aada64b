// Package reserve runs the reserve policy (devicemodel.ReservePolicy) on a
// node: it follows what the scheduler allocated from the node's pool (a
// ResourceClaim informer) and what the node prepared, keeps K spare GPUs
// chosen once (sticky, saved beside the checkpoint so a restart keeps
// them), and tells the publisher which GPUs publish their MIG placements
// and shares. A GPU stops publishing them only a hold time after it
// stopped qualifying, so an allocation the scheduler made before the node
// saw it never loses its device (docs/device-model.md, "Reserve policy").
package reserve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// DefaultHold is how long a GPU keeps publishing its MIG placements and
// shares after it stopped qualifying (no partition held, not a spare):
// longer than the scheduler takes from allocating a claim to storing the
// allocation plus the informer's delay, so an allocation the node has not
// seen yet keeps its device published. The policy's holdSeconds sets it.
const DefaultHold = devicemodel.DefaultReserveHoldSeconds * time.Second

// Allocated says which devices of the pool the scheduler has allocated;
// *Allocations implements it.
type Allocated interface {
	// AllocatedDevices names the devices of the pool that allocated
	// claims hold.
	AllocatedDevices() map[string]bool
	// AllocationsChanged is signaled when they may have changed, and once
	// they are first known.
	AllocationsChanged() <-chan struct{}
	// Synced reports whether every allocation is known (the informer
	// listed every claim).
	Synced() bool
}

// Options configure a Tracker.
type Options struct {
	// Policy is the node's reserve policy (SpareGPUs > 0).
	Policy devicemodel.ReservePolicy
	// Allocated follows the pool's allocations; nil: prepares only (tests).
	Allocated Allocated
	// StateFile keeps the spare choice across restarts; empty: not kept.
	StateFile string
	// Hold defaults to the policy's (DefaultHold unless it sets
	// holdSeconds); negative: no hold (tests only).
	Hold time.Duration
	// Now defaults to time.Now.
	Now func() time.Time
}

// Tracker decides which GPUs publish their MIG placements and shares; it
// implements publisher.Reserve.
type Tracker struct {
	opts Options
	mu   sync.Mutex
	// spares are the spare GPUs (counter set names), in the order chosen.
	spares []string
	// qualified GPUs were partitioned or spare at the last Show; stopped
	// is when the others stopped qualifying: they publish until Hold later.
	qualified map[string]bool
	stopped   map[string]time.Time
	// started: every GPU publishes until Hold after the first Show (the
	// first publication) and after the allocations are known, so what the
	// previous instance published (and the scheduler may have allocated)
	// stays until the node knows it.
	started time.Time
	// freeSince is when each free GPU was last seen becoming free; one
	// becomes a spare only a Hold later (chooseSpares). chosen: spares
	// were chosen once, so a free GPU not in freeSince was just freed.
	freeSince map[string]time.Time
	chosen    bool
}

// state is the StateFile's content.
type state struct {
	Spares []string `json:"spares"`
}

// New returns a tracker with the spares the state file names.
func New(ctx context.Context, opts Options) (*Tracker, error) {
	if !opts.Policy.Enabled() {
		return nil, fmt.Errorf("reserve policy: spareGPUs is %d, want at least 1", opts.Policy.SpareGPUs)
	}
	if opts.Hold == 0 {
		opts.Hold = opts.Policy.Hold()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	t := &Tracker{opts: opts, qualified: map[string]bool{}, stopped: map[string]time.Time{}, freeSince: map[string]time.Time{}}
	if opts.StateFile == "" {
		return t, nil
	}
	data, err := os.ReadFile(opts.StateFile)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read reserve state: %w", err)
	default:
		var s state
		if err := json.Unmarshal(data, &s); err != nil {
			// The choice is only sticky, not needed: choose again.
			klog.FromContext(ctx).Error(err, "Reserve state unreadable; choosing spare GPUs anew", "file", opts.StateFile)
		}
		t.spares = s.Spares
	}
	return t, nil
}

// Spares returns the spare GPUs, in the order chosen.
func (t *Tracker) Spares() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.spares)
}

// Changed implements publisher.Reserve.
func (t *Tracker) Changed() <-chan struct{} {
	if t.opts.Allocated == nil {
		return nil
	}
	return t.opts.Allocated.AllocationsChanged()
}

// Hide implements publisher.Reserve: res (the node's full model) without
// the MIG placements and shares of GPUs that neither qualify (partitioned,
// or spare) nor qualified less than Hold ago, given the devices prepared
// on the node and those the pool's claims are allocated. after > 0 asks to be called again
// that much later, when a hold ends.
func (t *Tracker) Hide(ctx context.Context, res resourceslice.DriverResources, pool string, prepared map[string]bool) (resourceslice.DriverResources, time.Duration) {
	held := prepared
	if t.opts.Allocated != nil {
		held = t.opts.Allocated.AllocatedDevices()
		for d := range prepared {
			held[d] = true
		}
	}
	show, after := t.Show(ctx, devicemodel.UseOf(res, pool, held))
	return devicemodel.Reserve(res, pool, show), after
}

// Show updates the spare choice for use and returns the GPUs that publish
// their MIG placements and shares, and when to ask again (0: no hold is
// running).
func (t *Tracker) Show(ctx context.Context, use devicemodel.GPUUse) (map[string]bool, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.opts.Now()
	if t.started.IsZero() {
		t.started = now
	}
	var after time.Duration
	if t.opts.Allocated != nil && !t.opts.Allocated.Synced() {
		// Not knowing what is allocated, publish everything and keep
		// the spares as they are.
		t.started = now
	} else {
		changed, wait := t.chooseSpares(use, now)
		if changed {
			t.save(ctx)
		}
		after = wait
	}
	show := map[string]bool{}
	for _, gpu := range use.GPUs {
		if use.Partitioned[gpu] || slices.Contains(t.spares, gpu) {
			t.qualified[gpu] = true
			delete(t.stopped, gpu)
			show[gpu] = true
			continue
		}
		if t.qualified[gpu] {
			delete(t.qualified, gpu)
			t.stopped[gpu] = now
		}
		since := t.started
		if stopped, ok := t.stopped[gpu]; ok && stopped.After(since) {
			since = stopped
		}
		if left := t.opts.Hold - now.Sub(since); left > 0 {
			show[gpu] = true
			if after == 0 || left < after {
				after = left
			}
		} else {
			delete(t.stopped, gpu)
		}
	}
	return show, after
}

// chooseSpares keeps the spares that are still free GPUs, in their order,
// and adds the last free GPUs in publication order up to K; it reports
// whether the choice changed, and how long until a GPU that is too newly
// free becomes eligible while spares are missing (0: none). A spare stops
// being one only when it is used (or leaves the node), never because
// another GPU became free.
//
// Last, because the allocator is first-fit in publication order (the
// upstream allocator sorts a pool's slices by name, and the resourceslice
// controller starts each name with the slice's index): a one-GPU claim
// takes the lowest free GPU, so it reaches a spare at the top only when no
// other GPU of the node is free. A spare at the bottom was taken by nearly
// every one-GPU claim, and each time the node published twice (the next
// spare's MIG placements and shares, then the used one's withdrawn).
//
// A GPU freed while the node had no free GPU to spare becomes a spare only
// a Hold after it was freed: on a node kept full by one-GPU pods, the
// freed GPU is usually taken whole again within seconds, and promoting it
// at once made the same two publications per pod. GPUs free at the first
// choice are eligible at once.
func (t *Tracker) chooseSpares(use devicemodel.GPUUse, now time.Time) (bool, time.Duration) {
	free := func(gpu string) bool { return slices.Contains(use.GPUs, gpu) && !use.Busy[gpu] }
	first := !t.chosen
	t.chosen = true
	for gpu := range t.freeSince {
		if !free(gpu) {
			delete(t.freeSince, gpu)
		}
	}
	for _, gpu := range use.GPUs {
		if _, ok := t.freeSince[gpu]; !ok && free(gpu) {
			t.freeSince[gpu] = now
			if first {
				t.freeSince[gpu] = now.Add(-max(t.opts.Hold, 0))
			}
		}
	}
	kept := slices.DeleteFunc(slices.Clone(t.spares), func(gpu string) bool { return !free(gpu) })
	var wait time.Duration
	for _, gpu := range slices.Backward(use.GPUs) {
		if len(kept) >= t.opts.Policy.SpareGPUs {
			break
		}
		if !free(gpu) || slices.Contains(kept, gpu) {
			continue
		}
		if left := t.opts.Hold - now.Sub(t.freeSince[gpu]); left > 0 {
			if wait == 0 || left < wait {
				wait = left
			}
			continue
		}
		kept = append(kept, gpu)
	}
	if len(kept) > t.opts.Policy.SpareGPUs { // K lowered since the state was saved
		kept = kept[:t.opts.Policy.SpareGPUs]
	}
	if len(kept) >= t.opts.Policy.SpareGPUs {
		wait = 0
	}
	changed := !slices.Equal(kept, t.spares)
	t.spares = kept
	return changed, wait
}

// save writes the spare choice; a failure only costs stickiness across a
// restart, so it is logged.
func (t *Tracker) save(ctx context.Context) {
	if t.opts.StateFile == "" {
		return
	}
	data, err := json.Marshal(state{Spares: t.spares})
	if err == nil {
		err = atomicfile.WriteFile(t.opts.StateFile, data, 0o600)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Save reserve state", "file", t.opts.StateFile)
	}
}
