package publisher

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/reserve"
)

// allocations is the pool's allocations as the informer reports them.
type allocations struct{ preparedSet }

func (a *allocations) AllocatedDevices() map[string]bool   { return a.PreparedDevices() }
func (a *allocations) AllocationsChanged() <-chan struct{} { return a.changed }
func (a *allocations) Synced() bool                        { return true }

// lastTarget keeps the last publication.
type lastTarget struct {
	mu   sync.Mutex
	last resourceslice.DriverResources
}

func (l *lastTarget) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.last = res
	return nil
}

// partitioned lists the GPUs whose MIG placements or shares are published.
func (l *lastTarget) partitioned() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	gpus := map[string]bool{}
	for _, s := range l.last.Pools[testNode].Slices {
		for i := range s.Devices {
			if gpu, ok := devicemodel.ReservableGPU(&s.Devices[i]); ok {
				gpus[gpu] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(gpus))
}

// TestRunReserve: under the reserve policy with one spare, the publisher
// publishes every GPU's MIG placements and shares until the start hold
// ends, then the spare's only; an allocation on the spare (seen through
// the informer, before any prepare) publishes the next spare's too, and
// once the claim is gone its GPU's go a hold later, without another event.
func TestRunReserve(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	n := simnode.New(t, "dgxh100", testNode)
	const hold = 300 * time.Millisecond
	alloc := &allocations{preparedSet{changed: make(chan struct{}, 1)}}
	tracker, err := reserve.New(ctx, reserve.Options{Policy: devicemodel.ReservePolicy{SpareGPUs: 1}, Allocated: alloc, Hold: hold})
	if err != nil {
		t.Fatal(err)
	}
	snaps := make(snapshots, 1)
	snaps <- health.Snapshot{}
	target := &lastTarget{}
	go Run(ctx, Options{
		Target: target, Health: snaps, Resources: n.Resources, Pool: testNode, Reserve: tracker,
		Prepared: &preparedSet{changed: make(chan struct{}, 1)}, Coalesce: time.Millisecond,
		Policy: health.DefaultTaintPolicy(testDriver), Devices: func() []health.Device { return nil },
	})
	expect := func(what string, within time.Duration, want ...string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, within, true, func(context.Context) (bool, error) {
			return slices.Equal(target.partitioned(), want), nil
		})
		if err != nil {
			t.Fatalf("%s: MIG placements and shares published on %v, want %v", what, target.partitioned(), want)
		}
	}
	all := []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}
	expect("at start", 5*time.Second, all...)
	expect("after the start hold", 5*time.Second, "gpu-7")
	alloc.set("gpu-7-mig-1g10gb-6")
	expect("a MIG device allocated on the spare", 5*time.Second, "gpu-6", "gpu-7")
	alloc.set()
	time.Sleep(hold / 2)
	if got := target.partitioned(); !slices.Equal(got, []string{"gpu-6", "gpu-7"}) {
		t.Fatalf("during the hold: published on %v, want gpu-7 still", got)
	}
	expect("after the hold", 5*time.Second, "gpu-6")
}
