package publisher

import (
	"context"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
)

const (
	testDriver = "gpu.dra.dev"
	testNode   = "node-1"
)

// preparedSet is the node's prepared devices as the prepare engine reports them.
type preparedSet struct {
	mu      sync.Mutex
	devices map[string]bool
	changed chan struct{}
}

func (p *preparedSet) PreparedDevices() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]bool{}
	for d := range p.devices {
		out[d] = true
	}
	return out
}

func (p *preparedSet) PreparedChanged() <-chan struct{} { return p.changed }

// set replaces the prepared devices and signals, as a prepare or unprepare does.
func (p *preparedSet) set(devices ...string) {
	p.mu.Lock()
	p.devices = map[string]bool{}
	for _, d := range devices {
		p.devices[d] = true
	}
	p.mu.Unlock()
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// controllerTarget publishes through the slice controller of
// k8s.io/dynamic-resource-allocation as kubeletplugin.Helper does: started
// on the first publication with the Node as owner, updated after.
// It records the most slices one publication changed after the first.
type controllerTarget struct {
	ctx        context.Context
	client     *fake.Clientset
	controller *resourceslice.Controller
	last       *resourceslice.DriverResources
	maxChanged int
}

func (c *controllerTarget) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	if c.last != nil {
		changed := 0
		for i, s := range res.Pools[testNode].Slices {
			if !sameSlice(s, c.last.Pools[testNode].Slices[i]) {
				changed++
			}
		}
		c.maxChanged = max(c.maxChanged, changed)
	}
	c.last = &res
	if c.controller != nil {
		c.controller.Update(&res)
		return nil
	}
	var err error
	c.controller, err = resourceslice.StartController(c.ctx, resourceslice.Options{
		DriverName: testDriver, KubeClient: c.client, Resources: &res,
		Owner: &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: testNode},
	})
	return err
}

// poolWatch follows the node's slices as the scheduler's informer does and
// records every moment the pool is incomplete by the allocator's rule (the
// slices of the highest generation are fewer than the pool's slice count).
type poolWatch struct {
	mu         sync.Mutex
	slices     map[string]*resourceapi.ResourceSlice
	complete   bool // seen complete once
	changes    int  // updates that changed a slice's devices
	incomplete []string
}

func watchPool(ctx context.Context, t *testing.T, client *fake.Clientset) *poolWatch {
	t.Helper()
	w, err := client.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := &poolWatch{slices: map[string]*resourceapi.ResourceSlice{}}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*resourceapi.ResourceSlice)
			if !ok {
				continue
			}
			p.mu.Lock()
			if old, ok := p.slices[s.Name]; ok && ev.Type == watch.Modified && !equalStrings(deviceNames(old.Spec.Devices), deviceNames(s.Spec.Devices)) {
				p.changes++
			}
			if ev.Type == watch.Deleted {
				delete(p.slices, s.Name)
			} else {
				p.slices[s.Name] = s
			}
			gen, count, want := int64(0), 0, int64(0)
			for _, s := range p.slices {
				gen = max(gen, s.Spec.Pool.Generation)
			}
			for _, s := range p.slices {
				if s.Spec.Pool.Generation == gen {
					count++
					want = s.Spec.Pool.ResourceSliceCount
				}
			}
			switch {
			case int64(count) == want:
				p.complete = true
			case p.complete:
				p.incomplete = append(p.incomplete, string(ev.Type)+" "+s.Name)
			}
			p.mu.Unlock()
		}
	}()
	return p
}

// devices is the pool's stored devices by slice name prefix, nil while
// the pool is incomplete.
func (p *poolWatch) devices() map[string][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string][]string{}
	for _, s := range p.slices {
		out[s.Name[:6]] = deviceNames(s.Spec.Devices)
	}
	return out
}

func deviceNames(devices []resourceapi.Device) []string {
	out := []string{}
	for _, d := range devices {
		out = append(out, d.Name)
	}
	return out
}

// wantDevices is res laid out as devices() reports it.
func wantDevices(res resourceslice.DriverResources) map[string][]string {
	out := map[string][]string{}
	slices := res.Pools[testNode].Slices
	for i, s := range slices {
		out[devicemodel.SliceIndexPrefix(i, len(slices))] = deviceNames(s.Devices)
	}
	return out
}

func sliceWrites(client *fake.Clientset) (creates, updates, deletes int) {
	for _, a := range client.Actions() {
		if a.GetResource().Resource != "resourceslices" {
			continue
		}
		switch a.GetVerb() {
		case "create":
			creates++
		case "update":
			updates++
		case "delete":
			deletes++
		}
	}
	return
}

// TestWithdrawalOneSliceAtATime runs Run through the real slice
// controller against a fake API server while prepares and unprepares on
// several GPUs arrive in bursts: no publication changes more than one
// slice, the stored slices follow what is prepared,
// each burst costs one update per GPU whose slice changes and no create or
// delete (the fake clientset's informers make the slice controller write an
// unchanged slice again now and then: counted apart). It logs how long
// after a burst the stored slices followed and whether a watcher (the
// scheduler's informer) saw the pool incomplete.
func TestWithdrawalOneSliceAtATime(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := simnode.New(t, "dgxh100", testNode)
	client := apiserver.NodeClient(testNode)
	pool := watchPool(ctx, t, client)
	prepared := &preparedSet{changed: make(chan struct{}, 1)}
	snaps := make(chan health.Snapshot, 1)
	snaps <- health.Snapshot{}
	done := make(chan struct{})
	target := &controllerTarget{ctx: ctx, client: client}
	go func() {
		defer close(done)
		Run(ctx, Options{
			Target: target, Health: chanSource(snaps),
			Resources: n.Resources, Pool: testNode, Prepared: prepared,
			Stored:  WatchSlices(ctx, client, testDriver, testNode),
			Devices: func() []health.Device { return nil }, Policy: health.DefaultTaintPolicy(testDriver),
			Coalesce: 50 * time.Millisecond,
		})
	}()

	waitFor := func(what string, res resourceslice.DriverResources) time.Duration {
		t.Helper()
		start := time.Now()
		want := wantDevices(res)
		err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			got := pool.devices()
			if len(got) != len(want) {
				return false, nil
			}
			for k, v := range want {
				if !equalStrings(got[k], v) {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("%s: stored slices %v, want %v", what, pool.devices(), want)
		}
		return time.Since(start)
	}
	waitFor("first publication", n.Resources)
	c0, u0, d0 := sliceWrites(client)
	pool.mu.Lock()
	changes0 := pool.changes
	pool.mu.Unlock()

	steps := []struct {
		name     string
		prepared [][]string // one set per prepare or unprepare of the burst
		changed  int        // GPU slices the burst changes
	}{
		{"three GPUs: whole, share, MIG", [][]string{{"gpu-0"}, {"gpu-0", "gpu-1-ts"}, {"gpu-0", "gpu-1-ts", "gpu-2-mig-1g10gb-6"}}, 3},
		{"seven 1g MIG devices on one GPU", [][]string{
			{"gpu-0", "gpu-1-ts", "gpu-2-mig-1g10gb-6", "gpu-3-mig-1g10gb-6"},
			{"gpu-0", "gpu-1-ts", "gpu-2-mig-1g10gb-6", "gpu-3-mig-1g10gb-6", "gpu-3-mig-1g10gb-5", "gpu-3-mig-1g10gb-4"},
			{"gpu-0", "gpu-1-ts", "gpu-2-mig-1g10gb-6", "gpu-3-mig-1g10gb-6", "gpu-3-mig-1g10gb-5", "gpu-3-mig-1g10gb-4", "gpu-3-mig-1g10gb-3", "gpu-3-mig-1g10gb-2", "gpu-3-mig-1g10gb-1", "gpu-3-mig-1g10gb-0"},
		}, 1},
		{"everything unprepared", [][]string{{}}, 4},
	}
	for _, st := range steps {
		for _, devices := range st.prepared {
			prepared.set(devices...)
		}
		last := st.prepared[len(st.prepared)-1]
		want := devicemodel.Withdraw(n.Resources, testNode, prepared.PreparedDevices())
		took := waitFor(st.name, want)
		c, u, d := sliceWrites(client)
		pool.mu.Lock()
		changes := pool.changes - changes0
		changes0 = pool.changes
		pool.mu.Unlock()
		t.Logf("%s: stored %v after the burst; %d slice updates changed devices, %d updates in all", st.name, took, changes, u-u0)
		if c != c0 || d != d0 {
			t.Errorf("%s: %d creates and %d deletes, want none", st.name, c-c0, d-d0)
		}
		if changes != st.changed {
			t.Errorf("%s (%d prepared): %d slice updates changed devices, want %d (one per GPU slice that changed)", st.name, len(last), changes, st.changed)
		}
		u0 = u
	}
	cancel()
	<-done
	if target.maxChanged > 1 {
		t.Errorf("a publication changed %d slices: the slice controller bumps the generation and rewrites the pool", target.maxChanged)
	}
	pool.mu.Lock()
	defer pool.mu.Unlock()
	// Reported, not asserted: on a loaded machine the slice controller
	// over the fake clientset now and then works from a stale view of a
	// slice (it also rewrites unchanged slices, above) and bumps the
	// generation even so.
	if len(pool.incomplete) > 0 {
		t.Logf("pool seen incomplete after %v", pool.incomplete)
	} else {
		t.Logf("pool never seen incomplete")
	}
}

type chanSource chan health.Snapshot

func (c chanSource) Subscribe(context.Context) <-chan health.Snapshot { return c }

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
