// Package handover makes one kubelet plugin instance per node the owner of
// the node's state (the checkpoint, MIG instances, MPS daemons, CDI specs,
// the node's ResourceSlices) while a rolling upgrade runs two instances side
// by side: an exclusive flock on a file in the plugin data directory, taken
// before recovery and held until the instance has stopped mutating. The
// file records its owner for operators. The kernel releases the lock when
// its holder dies, so a crashed instance never blocks its successor.
//
// Gate is the other half: the plugin the kubelet helper serves while the
// instance waits for the lock, so that the instance registers (and becomes
// Ready) before it owns the node, and drains its calls before it lets go;
// Forwarder sends the calls that still reach it then to the newer instance.
package handover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// LockFile is the lock's name inside the plugin data directory.
const LockFile = "handover.lock"

// pollInterval is how often a waiting instance retries the lock: the
// hand-over's added latency, traded against wakeups while waiting.
const pollInterval = 200 * time.Millisecond

// Owner identifies the instance that holds the lock; it is what the lock
// file holds, as JSON, for `cat` on the node.
type Owner struct {
	PodName string    `json:"podName,omitempty"`
	PodUID  string    `json:"podUID,omitempty"`
	PID     int       `json:"pid"`
	Since   time.Time `json:"since"`
}

// String names the owner for logs and errors.
func (o Owner) String() string {
	switch {
	case o.PodName != "":
		return fmt.Sprintf("pod %s (pid %d, since %s)", o.PodName, o.PID, o.Since.Format(time.RFC3339))
	case o.PID != 0:
		return fmt.Sprintf("pid %d (since %s)", o.PID, o.Since.Format(time.RFC3339))
	}
	return "an unrecorded owner"
}

// Lock is the held hand-over lock.
type Lock struct {
	file *os.File
}

// ReadOwner returns the owner recorded in dir's lock file: the holder
// while the lock is held, the last holder otherwise.
func ReadOwner(dir string) (Owner, error) {
	var o Owner
	data, err := os.ReadFile(filepath.Join(dir, LockFile))
	if err != nil {
		return o, err
	}
	if len(data) == 0 {
		return o, nil
	}
	if err := json.Unmarshal(data, &o); err != nil {
		return o, fmt.Errorf("read hand-over owner from %s: %w", filepath.Join(dir, LockFile), err)
	}
	return o, nil
}

// Acquire takes the lock in dir, waiting as long as another instance holds
// it or until ctx ends, and records me as the owner (PID and Since are
// filled in). waiting, when set, is called once with the current holder
// if the lock is taken.
func Acquire(ctx context.Context, dir string, me Owner, waiting func(holder Owner)) (*Lock, error) {
	path := filepath.Join(dir, LockFile)
	// No O_TRUNC: the holder's record must survive a waiter's open.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open hand-over lock: %w", err)
	}
	logger := klog.FromContext(ctx)
	ticker := (*time.Ticker)(nil)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if ticker == nil {
			ticker = time.NewTicker(pollInterval)
			defer ticker.Stop()
			holder, _ := ReadOwner(dir)
			logger.Info("Waiting for the instance that owns the node to hand over", "lock", path, "holder", holder.String())
			if waiting != nil {
				waiting(holder)
			}
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("wait for hand-over lock %s: %w", path, context.Cause(ctx))
		case <-ticker.C:
		}
	}
	me.PID, me.Since = os.Getpid(), time.Now().UTC().Truncate(time.Second)
	if err := record(f, me); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("record hand-over owner in %s: %w", path, err)
	}
	logger.Info("Owning the node's plugin state", "lock", path, "owner", me.String())
	return &Lock{file: f}, nil
}

func record(f *os.File, me Owner) error {
	data, err := json.Marshal(me)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt(append(data, '\n'), 0); err != nil {
		return err
	}
	return f.Sync()
}

// Release lets the next instance take over. The record stays, naming the
// last owner, until the next one writes its own. Release on nil or twice
// does nothing.
func (l *Lock) Release(ctx context.Context) {
	if l == nil || l.file == nil {
		return
	}
	// Closing the only descriptor drops the flock.
	if err := l.file.Close(); err != nil {
		klog.FromContext(ctx).Error(err, "Release hand-over lock")
	}
	l.file = nil
	klog.FromContext(ctx).Info("Handed over the node's plugin state")
}
