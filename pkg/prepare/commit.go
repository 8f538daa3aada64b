package prepare

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// Checkpoint changes are group-committed: a change is applied in memory,
// then one save (an fsynced file and directory) makes every change made
// until then durable, and all their callers return together. Claims on
// different GPUs are prepared in parallel, so without this their saves
// would queue behind one another. Readers of d.cp may see a change before
// it is durable; nothing they decide must outlive a failed save (a refused
// prepare is retried by the kubelet).

// commitBatch is the changes one save makes durable.
type commitBatch struct {
	undo []claimUndo
	done chan struct{}
	err  error
}

// claimUndo restores a claim's entry when the save of its change fails.
type claimUndo struct {
	uid  types.UID
	prev *checkpoint.PreparedClaim // nil: the claim had no entry
}

// put records entry in the checkpoint durably.
func (d *Engine) put(ctx context.Context, entry *checkpoint.PreparedClaim) error {
	return d.commit(ctx, entry.UID, cloneClaim(entry))
}

// remove deletes a claim from the checkpoint durably.
func (d *Engine) remove(ctx context.Context, uid types.UID) error {
	return d.commit(ctx, uid, nil)
}

// commit sets the claim's entry (nil deletes it) and returns once a save
// that includes the change is durable. If that save fails, the change is
// undone in memory, so memory never claims more than disk for long, and
// the error is returned. Callers never change the same claim concurrently
// (its GPUs' locks are held).
func (d *Engine) commit(ctx context.Context, uid types.UID, entry *checkpoint.PreparedClaim) error {
	d.mu.Lock()
	undo := claimUndo{uid: uid}
	if prev, ok := d.cp.Get(uid); ok {
		undo.prev = prev
	}
	if entry != nil {
		d.cp.Put(entry)
	} else {
		d.cp.Delete(uid)
		delete(d.problems, uid) // dealt with at last
	}
	if d.batch == nil {
		d.batch = &commitBatch{done: make(chan struct{})}
	}
	b := d.batch
	b.undo = append(b.undo, undo)
	d.mu.Unlock()

	// The first caller to get saveMu saves for everyone queued so far;
	// the others find their batch done when they get it.
	d.saveMu.Lock()
	defer d.saveMu.Unlock()
	select {
	case <-b.done:
		return b.err
	default:
	}
	d.mu.Lock()
	d.batch = nil
	snapshot := cloneCheckpoint(d.cp)
	d.mu.Unlock()
	// One caller's cancellation must not fail the others' changes; a save
	// takes milliseconds, and the probes see one that does not end.
	end := d.inflight.begin("checkpoint save")
	d.fault(FaultCheckpointSaving)
	err := d.store.Save(context.WithoutCancel(ctx), snapshot)
	end()
	if err != nil {
		err = fmt.Errorf("save checkpoint: %w", err)
		d.mu.Lock()
		for i := len(b.undo) - 1; i >= 0; i-- {
			if u := b.undo[i]; u.prev != nil {
				d.cp.Put(u.prev)
			} else {
				d.cp.Delete(u.uid)
			}
		}
		d.mu.Unlock()
	} else {
		klog.FromContext(ctx).V(6).Info("Saved checkpoint", "claims", snapshot.Len(), "changes", len(b.undo))
	}
	b.err = err
	close(b.done)
	return err
}
