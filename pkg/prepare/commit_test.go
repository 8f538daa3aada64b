package prepare

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// gateStore is a checkpoint store whose saves wait for a gate, can fail,
// and are recorded.
type gateStore struct {
	gate    chan struct{} // nil: saves do not wait
	started chan struct{} // if set, told of every save that starts
	fail    error

	mu    sync.Mutex
	saves []*checkpoint.Checkpoint
}

func (s *gateStore) Load(context.Context) (*checkpoint.Checkpoint, error) {
	return checkpoint.New(), nil
}

func (s *gateStore) Save(_ context.Context, c *checkpoint.Checkpoint) error {
	if s.started != nil {
		s.started <- struct{}{}
	}
	if s.gate != nil {
		<-s.gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.saves = append(s.saves, cloneCheckpoint(c))
	return nil
}

func claimEntry(name string, state checkpoint.ClaimState) *checkpoint.PreparedClaim {
	return &checkpoint.PreparedClaim{UID: types.UID(name + "-uid"), Namespace: "ns", Name: name, State: state}
}

// waitQueued waits until n changes wait for the next save.
func waitQueued(t *testing.T, d *Engine, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.mu.Lock()
		queued := 0
		if d.batch != nil {
			queued = len(d.batch.undo)
		}
		d.mu.Unlock()
		if queued == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d changes queued, want %d", queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Changes made while a save runs are made durable together by the next one.
func TestCommitGroupsConcurrentChanges(t *testing.T) {
	ctx := context.Background()
	st := &gateStore{gate: make(chan struct{}), started: make(chan struct{}, 5)}
	d := &Engine{cp: checkpoint.New(), store: st}

	errs := make(chan error, 5)
	go func() { errs <- d.put(ctx, claimEntry("first", checkpoint.PrepareStarted)) }()
	<-st.started // the first change's save runs
	for i := range 4 {
		go func() { errs <- d.put(ctx, claimEntry(fmt.Sprintf("c%d", i), checkpoint.PrepareCompleted)) }()
	}
	waitQueued(t, d, 4)
	close(st.gate)
	for range 5 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if len(st.saves) != 2 {
		t.Fatalf("%d saves for 1+4 changes, want 2", len(st.saves))
	}
	if got := st.saves[1].Len(); got != 5 {
		t.Errorf("the second save holds %d claims, want all 5", got)
	}
}

// A failed save undoes exactly the changes of its batch, and returns the
// error to each of their callers.
func TestCommitFailureUndoesItsBatch(t *testing.T) {
	ctx := context.Background()
	st := &gateStore{}
	d := &Engine{cp: checkpoint.New(), store: st}
	for _, name := range []string{"kept", "updated", "removed"} {
		if err := d.put(ctx, claimEntry(name, checkpoint.PrepareStarted)); err != nil {
			t.Fatal(err)
		}
	}

	st.gate, st.started, st.fail = make(chan struct{}), make(chan struct{}, 3), errors.New("disk full")
	errs := make(chan error, 3)
	go func() { errs <- d.put(ctx, claimEntry("blocker", checkpoint.PrepareStarted)) }()
	<-st.started
	go func() { errs <- d.put(ctx, claimEntry("updated", checkpoint.PrepareCompleted)) }()
	go func() { errs <- d.remove(ctx, claimEntry("removed", "").UID) }()
	waitQueued(t, d, 2)
	close(st.gate)
	for range 3 {
		if err := <-errs; err == nil || !errors.Is(err, st.fail) {
			t.Errorf("commit during failing saves: %v, want %v", err, st.fail)
		}
	}
	want := map[string]checkpoint.ClaimState{"kept": checkpoint.PrepareStarted, "updated": checkpoint.PrepareStarted, "removed": checkpoint.PrepareStarted}
	got := map[string]checkpoint.ClaimState{}
	for _, c := range d.PreparedClaims() {
		got[c.Name] = c.State
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("checkpoint in memory after failed saves: %v, want the durable %v", got, want)
	}
}
