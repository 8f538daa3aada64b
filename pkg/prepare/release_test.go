package prepare

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

var errNotStale = errors.New("not stale")

func object(name string) kubeletplugin.NamespacedObject {
	claim := allocated(name, nil)
	return kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}, UID: claim.UID}
}

// TestReleaseClaim: a release unprepares the claim as the kubelet's
// unprepare does, and frees its device for another claim; a check that
// finds the claim no longer stale changes nothing.
func TestReleaseClaim(t *testing.T) {
	for name, tc := range map[string]struct {
		check        error
		wantReleased bool
	}{
		"still stale": {wantReleased: true},
		"not stale":   {check: errNotStale},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			d := newTestDriver(t, nil)
			if err := prepareOne(t, d, allocated("old", []string{"gpu-0"})); err != nil {
				t.Fatal(err)
			}
			err := d.ReleaseClaim(ctx, object("old"), func(context.Context) error { return tc.check })
			if !errors.Is(err, tc.check) {
				t.Fatalf("ReleaseClaim: %v, want %v", err, tc.check)
			}
			if got := len(d.PreparedClaims()); got != map[bool]int{true: 0, false: 1}[tc.wantReleased] {
				t.Errorf("%d claims prepared after the release (released: %v)", got, tc.wantReleased)
			}
			err = prepareOne(t, d, allocated("new", []string{"gpu-0"}))
			if tc.wantReleased && err != nil {
				t.Errorf("gpu-0 not free after the release: %v", err)
			}
			if !tc.wantReleased && err == nil {
				t.Error("gpu-0 given to a second claim while the first is kept")
			}
		})
	}
}

// TestReleaseClaimWaitsForPrepare: a release of a claim whose prepare is in
// flight checks the claim only after the prepare finished, so it cannot
// take away what the kubelet is being handed.
func TestReleaseClaimWaitsForPrepare(t *testing.T) {
	ctx := t.Context()
	reached, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	d := newTestDriver(t, func(point string) {
		if point == FaultPrepareStarted {
			once.Do(func() { close(reached); <-proceed })
		}
	})
	prepared := make(chan error, 1)
	go func() { prepared <- prepareOne(t, d, allocated("claim", []string{"gpu-0"})) }()
	<-reached

	checked := make(chan checkpoint.ClaimState, 1)
	released := make(chan error, 1)
	go func() {
		released <- d.ReleaseClaim(ctx, object("claim"), func(context.Context) error {
			state := checkpoint.ClaimState("")
			for _, c := range d.PreparedClaims() {
				state = c.State
			}
			checked <- state
			return errNotStale // the prepare made the claim in use
		})
	}()
	select {
	case <-checked:
		t.Fatal("the release checked the claim while its prepare was in flight")
	case <-time.After(300 * time.Millisecond):
	}
	close(proceed)
	if err := <-prepared; err != nil {
		t.Fatal(err)
	}
	select {
	case state := <-checked:
		if state != checkpoint.PrepareCompleted {
			t.Errorf("the release checked the claim in state %q, want it after the prepare completed", state)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the release did not go on after the prepare finished")
	}
	if err := <-released; !errors.Is(err, errNotStale) {
		t.Errorf("ReleaseClaim: %v, want %v", err, errNotStale)
	}
	if len(d.PreparedClaims()) != 1 {
		t.Error("the claim the release found in use was unprepared")
	}
}
