package devicemodel_test

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/reserve"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

var reserveSeed = flag.Uint64("reserve.seed", 0, "seed of TestReserveNeverDoubleAllocates (0: from the clock)")

// seenAllocations is the node's view of the pool's allocations: what the
// ResourceClaim informer has delivered so far.
type seenAllocations struct{ devices map[string]bool }

func (s *seenAllocations) AllocatedDevices() map[string]bool   { return maps.Clone(s.devices) }
func (s *seenAllocations) AllocationsChanged() <-chan struct{} { return nil }
func (s *seenAllocations) Synced() bool                        { return true }

// reserveWalk is a random sequence of allocate, prepare, unprepare and
// release, as withdrawWalk's, with the upstream allocator over what a node
// under the reserve policy with k spare GPUs publishes. The node learns of
// allocations lag steps late (the informer's delay; the scheduler allocates
// from what was published before it knew), prepares at once, and each step
// is one second of its clock. It returns the first allocation that
// conflicts with what claims hold (on the full model), and how often each
// operation ran.
func reserveWalk(t *testing.T, n *simnode.Node, k int, hold time.Duration, lag int, seed uint64, steps int) (map[string]int, error) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0))
	ctx := context.Background()
	res := n.Resources
	classes := deviceclass.DeviceClasses(driverName)
	full := at.NewCluster(namedSlices(res, n.Name), classes)
	reserved := at.NewCluster(nil, classes)
	devices := publishedByName(res)
	var profiles []string
	for _, p := range n.GPUs[0].MIG.Profiles {
		profiles = append(profiles, p.Name)
	}
	clock := time.Unix(0, 0)
	seen := &seenAllocations{}
	tracker, err := reserve.New(ctx, reserve.Options{Policy: devicemodel.ReservePolicy{SpareGPUs: k}, Allocated: seen,
		Hold: hold, Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}

	var claims []*held
	var history []map[string]bool // allocated devices after each step
	allocatedClaims := func() []*resourceapi.ResourceClaim {
		var out []*resourceapi.ResourceClaim
		for _, h := range claims {
			if !h.released {
				out = append(out, h.claim)
			}
		}
		return out
	}
	republish := func() {
		prepared := map[string]bool{}
		for _, h := range claims {
			if h.prepared {
				for _, d := range at.Devices(h.claim) {
					prepared[d] = true
				}
			}
		}
		hidden, _ := tracker.Hide(ctx, res, n.Name, prepared)
		reserved.Slices = namedSlices(devicemodel.Withdraw(hidden, n.Name, prepared), n.Name)
	}
	ops := map[string]int{}
	republish()
	clock = clock.Add(time.Hour) // past the start hold
	republish()
	for step := range steps {
		switch op := rng.IntN(20); {
		case op < 10:
			claim := randomClaim(rng, profiles, step)
			full.Allocated, reserved.Allocated = allocatedClaims(), allocatedClaims()
			fullGot, err := full.Allocate(ctx, n.Name, claim.DeepCopy())
			if err != nil {
				t.Fatalf("step %d: full model: allocate %s: %v", step, describe(claim), err)
			}
			got, err := reserved.Allocate(ctx, n.Name, claim.DeepCopy())
			if err != nil {
				t.Fatalf("step %d: reserve model: allocate %s: %v", step, describe(claim), err)
			}
			switch {
			case got != nil:
				var released []*resourceapi.ResourceClaim
				for _, h := range claims {
					if h.released {
						released = append(released, h.claim)
					}
				}
				if err := conflict(devices, append(allocatedClaims(), got[0]), released); err != nil {
					return ops, fmt.Errorf("step %d: %s got %v: %w", step, describe(claim), at.Devices(got[0]), err)
				}
				claims = append(claims, &held{claim: got[0]})
				ops["allocate"]++
			case fullGot != nil:
				ops["refused (fits the full model)"]++
			default:
				ops["allocate (does not fit)"]++
			}
		default:
			lifecycleStep(rng, op, claims, ops)
		}
		claims = slices.DeleteFunc(claims, func(h *held) bool { return h.released && !h.prepared })
		now := map[string]bool{}
		for _, c := range allocatedClaims() {
			for _, d := range at.Devices(c) {
				now[d] = true
			}
		}
		history = append(history, now)
		seen.devices = history[max(0, len(history)-1-lag)]
		clock = clock.Add(time.Second)
		republish()
	}
	return ops, nil
}

// TestReserveNeverDoubleAllocates walks random sequences (reserveWalk) on a
// DGX H100 under the reserve policy, K=1 and K=2, with the node learning
// of allocations up to 3 s late and the default hold: the scheduler never
// allocates a device twice nor overdraws a counter or a share's capacity,
// while claims that need more than K fresh GPUs are refused. Rerun a
// failure with the seed it prints.
func TestReserveNeverDoubleAllocates(t *testing.T) {
	seed := *reserveSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun: go test ./pkg/devicemodel -run TestReserveNeverDoubleAllocates -reserve.seed=%d)", seed, seed)
	n := simnode.New(t, "dgxh100", "node-1")
	for _, tc := range []struct{ k, lag int }{{1, 0}, {1, 3}, {2, 3}} {
		t.Run(fmt.Sprintf("K=%d,lag=%ds", tc.k, tc.lag), func(t *testing.T) {
			ops, err := reserveWalk(t, n, tc.k, reserve.DefaultHold, tc.lag, seed, *withdrawSteps)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("operations: %v", ops)
			// Refusals the full model would allocate are rare here (0–6 in
			// 400 steps); TestReserveRefusesMoreThanKFreshGPUs has them.
			if ops["allocate"] == 0 || ops["prepare"] == 0 || ops["allocate (does not fit)"] == 0 {
				t.Errorf("the sequence did not exercise allocations, prepares and a full node: %v", ops)
			}
		})
	}
}

// TestReserveNeedsHoldAndAllocations is the evidence for the hold and for
// following allocations: a node that learns of allocations 6 s late (the
// default hold is 30 s) and hides at once, or one that follows only its prepares, hides the MIG
// placements and shares of a GPU while the scheduler has allocated one of
// them, and the scheduler, which charges an allocated device's counters
// only while it is published, hands the GPU out again. (With the spares
// at the top of the publication order, whole-GPU claims rarely move them,
// and a 3 s delay took 27 seeds to show it; 6 s shows it at once.)
func TestReserveNeedsHoldAndAllocations(t *testing.T) {
	n := simnode.New(t, "dgxh100", "node-1")
	for name, tc := range map[string]struct {
		hold time.Duration
		lag  int
	}{
		"no hold, allocations seen 6 s late": {hold: -1, lag: 6},
		"prepares only":                      {hold: reserve.DefaultHold, lag: 1 << 30},
	} {
		t.Run(name, func(t *testing.T) {
			for seed := range uint64(20) {
				if _, err := reserveWalk(t, n, 1, tc.hold, tc.lag, seed+1, *withdrawSteps); err != nil {
					t.Logf("seed %d: %v", seed+1, err)
					return
				}
			}
			t.Error("no walk double-allocated: the walk does not exercise what the hold and the informer are for")
		})
	}
}

// TestReserveRefusesMoreThanKFreshGPUs: on an empty DGX H100 under the
// reserve policy, a claim needing MIG devices on more fresh GPUs than K is
// refused (the allocator finds no allocation: kube-scheduler reports
// "cannot allocate all claims"), one within K is allocated, and once the
// node has seen it, the next spare takes the next claim.
func TestReserveRefusesMoreThanKFreshGPUs(t *testing.T) {
	n := simnode.New(t, "dgxh100", "node-1")
	seven := func(count int64) *resourceapi.ResourceClaim {
		return at.Claim("sevens", at.Exactly("mig", "mig."+driverName, count, at.Profile("7g.80gb")))
	}
	shares := at.WithConstraints(at.Claim("shares", at.Exactly("a", "timeslice."+driverName, 1), at.Exactly("b", "mps."+driverName, 1)),
		at.MatchAttribute(attr(vocabulary.AttrNUMANode)))
	allTimeSlices := at.Claim("all", resourceapi.DeviceRequest{Name: "all", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "timeslice." + driverName, AllocationMode: resourceapi.DeviceAllocationModeAll}})
	for name, tc := range map[string]struct {
		k       int
		claim   *resourceapi.ResourceClaim
		fits    bool
		devices []string
	}{
		"one 7g on K=1":               {k: 1, claim: seven(1), fits: true, devices: []string{"gpu-7-mig-7g80gb-0"}},
		"two 7g on K=1":               {k: 1, claim: seven(2)},
		"two 7g on K=2":               {k: 2, claim: seven(2), fits: true, devices: []string{"gpu-6-mig-7g80gb-0", "gpu-7-mig-7g80gb-0"}},
		"three 7g on K=2":             {k: 2, claim: seven(3)},
		"time slice and MPS, K=1":     {k: 1, claim: shares},
		"time slice and MPS, K=2":     {k: 2, claim: shares, fits: true, devices: []string{"gpu-6-ts", "gpu-7-mps"}},
		"whole GPUs are all there":    {k: 1, claim: at.Claim("gpus", at.Exactly("gpu", driverName, 8)), fits: true},
		"one 1g on a fresh GPU, K=1":  {k: 1, claim: at.Claim("one", at.Exactly("mig", "mig."+driverName, 1, at.Profile("1g.10gb"))), fits: true, devices: []string{"gpu-7-mig-1g10gb-6"}},
		"seven 1g on one GPU, K=1":    {k: 1, claim: at.Claim("seven", at.Exactly("mig", "mig."+driverName, 7, at.Profile("1g.10gb"))), fits: true},
		"eight 1g on two GPUs, K=1":   {k: 1, claim: at.Claim("eight", at.Exactly("mig", "mig."+driverName, 8, at.Profile("1g.10gb")))},
		"all time slices, K=1":        {k: 1, claim: allTimeSlices, fits: true, devices: []string{"gpu-7-ts"}},
		"all time slices, full model": {k: 0, claim: allTimeSlices, fits: true, devices: []string{"gpu-0-ts", "gpu-1-ts", "gpu-2-ts", "gpu-3-ts", "gpu-4-ts", "gpu-5-ts", "gpu-6-ts", "gpu-7-ts"}},
		"eight 1g on two GPUs, K=2":   {k: 2, claim: at.Claim("eight", at.Exactly("mig", "mig."+driverName, 8, at.Profile("1g.10gb"))), fits: true},
		"a share beside a 7g, K=1":    {k: 1, claim: at.Claim("mixed", at.Exactly("mig", "mig."+driverName, 1, at.Profile("7g.80gb")), at.Exactly("ts", "timeslice."+driverName, 1))},
		"a share beside a 7g, K=2":    {k: 2, claim: at.Claim("mixed", at.Exactly("mig", "mig."+driverName, 1, at.Profile("7g.80gb")), at.Exactly("ts", "timeslice."+driverName, 1)), fits: true},
		"the full model takes all 7g": {k: 0, claim: seven(8), fits: true},
	} {
		t.Run(name, func(t *testing.T) {
			c := at.NewCluster(namedSlices(reserveView(t, n, tc.k, nil), n.Name), deviceclass.DeviceClasses(driverName))
			got, err := c.Allocate(t.Context(), n.Name, tc.claim)
			if err != nil {
				t.Fatal(err)
			}
			if (got != nil) != tc.fits {
				t.Fatalf("allocated %v, want fits=%v", got != nil, tc.fits)
			}
			if tc.devices != nil && !slices.Equal(at.Devices(got[0]), tc.devices) {
				t.Errorf("got %v, want %v", at.Devices(got[0]), tc.devices)
			}
		})
	}
	// Once the node has seen a 7g allocated on its spare, the next one
	// fits on the new spare.
	c := at.NewCluster(namedSlices(reserveView(t, n, 1, nil), n.Name), deviceclass.DeviceClasses(driverName))
	first := c.MustAllocate(t, n.Name, seven(1))
	allocated := map[string]bool{}
	for _, d := range at.Devices(first[0]) {
		allocated[d] = true
	}
	c.Slices = namedSlices(reserveView(t, n, 1, allocated), n.Name)
	if got := c.MustAllocate(t, n.Name, seven(1)); !slices.Equal(at.Devices(got[0]), []string{"gpu-6-mig-7g80gb-0"}) {
		t.Errorf("second 7g got %v, want gpu-6-mig-7g80gb-0", at.Devices(got[0]))
	}
}

// reserveView is what node n publishes under the reserve policy with k
// spare GPUs (0: off) while allocated holds the named devices and nothing
// is prepared, after the start hold.
func reserveView(t *testing.T, n *simnode.Node, k int, allocated map[string]bool) resourceslice.DriverResources {
	t.Helper()
	if k == 0 {
		return n.Resources
	}
	tracker, err := reserve.New(t.Context(), reserve.Options{Policy: devicemodel.ReservePolicy{SpareGPUs: k},
		Allocated: &seenAllocations{devices: allocated}, Hold: -1})
	if err != nil {
		t.Fatal(err)
	}
	res, _ := tracker.Hide(t.Context(), n.Resources, n.Name, nil)
	return res
}

// TestWholeGPUClaimsLeaveTheSpare: one-GPU claims filling a DGX H100 under
// the reserve policy (K=1), allocated by the upstream allocator, which is
// first-fit in publication order, and then churned at 6 of 8 GPUs, never
// take the spare and so never change what the node publishes, until the
// claim that fills the node takes the spare and its MIG placements and
// shares are withdrawn. (A spare at the bottom of the order was taken by
// every one-GPU claim: two publications per claim, each a slice update that
// every scheduler re-reads.)
func TestWholeGPUClaimsLeaveTheSpare(t *testing.T) {
	n := simnode.New(t, "dgxh100", "node-1")
	seen := &seenAllocations{devices: map[string]bool{}}
	tracker, err := reserve.New(t.Context(), reserve.Options{Policy: devicemodel.ReservePolicy{SpareGPUs: 1}, Allocated: seen, Hold: -1})
	if err != nil {
		t.Fatal(err)
	}
	publish := func() []*resourceapi.ResourceSlice {
		res, _ := tracker.Hide(t.Context(), n.Resources, n.Name, nil)
		return namedSlices(devicemodel.Withdraw(res, n.Name, seen.devices), n.Name)
	}
	c := at.NewCluster(publish(), deviceclass.DeviceClasses(driverName))
	updates := 0
	allocate := func(i int) *resourceapi.ResourceClaim {
		claim := at.Claim(fmt.Sprintf("one-%d", i), at.Exactly("gpu", driverName, 1))
		got := c.MustAllocate(t, n.Name, claim)[0] // recorded in c.Allocated
		for _, d := range at.Devices(got) {
			seen.devices[d] = true
		}
		if next := publish(); !equality.Semantic.DeepEqual(next, c.Slices) {
			updates++
			c.Slices = next
		}
		return got
	}
	for i := range 6 {
		allocate(i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 50 {
		gone := c.Allocated[rng.IntN(len(c.Allocated))]
		c.Release(gone)
		for _, d := range at.Devices(gone) {
			delete(seen.devices, d)
		}
		allocate(6 + i)
	}
	if updates != 0 || !slices.Equal(tracker.Spares(), []string{"gpu-7"}) {
		t.Fatalf("6 one-GPU claims and 50 replaced: %d publications changed, spares %v; want none, gpu-7", updates, tracker.Spares())
	}
	allocate(100)
	allocate(101) // the node is full: the spare is taken
	if updates != 1 || len(tracker.Spares()) != 0 {
		t.Errorf("the node filled: %d publications changed, spares %v; want 1 (the spare's MIG placements and shares withdrawn), none", updates, tracker.Spares())
	}
}

// TestFullNodeChurnLeavesThePublication: a DGX H100 kept full by one-GPU
// claims (the scheduler packs nodes), each replaced a second after its
// predecessor goes, under the reserve policy with the default hold: the
// freed GPU is taken whole again before it has been free for the hold, so
// it never becomes the spare and the node's publication never changes.
// (Promoted at once, it was published and withdrawn again for every
// replaced claim.)
func TestFullNodeChurnLeavesThePublication(t *testing.T) {
	n := simnode.New(t, "dgxh100", "node-1")
	seen := &seenAllocations{devices: map[string]bool{}}
	clock := time.Unix(0, 0)
	tracker, err := reserve.New(t.Context(), reserve.Options{Policy: devicemodel.ReservePolicy{SpareGPUs: 1}, Allocated: seen,
		Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	c := at.NewCluster(nil, deviceclass.DeviceClasses(driverName))
	updates := 0
	publish := func(d time.Duration) {
		clock = clock.Add(d)
		seen.devices = map[string]bool{}
		for _, claim := range c.Allocated {
			for _, d := range at.Devices(claim) {
				seen.devices[d] = true
			}
		}
		res, _ := tracker.Hide(t.Context(), n.Resources, n.Name, nil)
		if next := namedSlices(devicemodel.Withdraw(res, n.Name, seen.devices), n.Name); !equality.Semantic.DeepEqual(next, c.Slices) {
			updates++
			c.Slices = next
		}
	}
	publish(0)
	publish(time.Hour) // past the start hold
	for i := range 8 {
		c.MustAllocate(t, n.Name, at.Claim(fmt.Sprintf("fill-%d", i), at.Exactly("gpu", driverName, 1)))
		publish(time.Second)
	}
	publish(time.Minute) // the used spare's hold ends
	updates = 0
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 50 {
		c.Release(c.Allocated[rng.IntN(len(c.Allocated))])
		publish(time.Second)
		c.MustAllocate(t, n.Name, at.Claim(fmt.Sprintf("churn-%d", i), at.Exactly("gpu", driverName, 1)))
		publish(time.Second)
	}
	if updates != 0 {
		t.Errorf("50 one-GPU claims replaced on a full node: the publication changed %d times, want 0", updates)
	}
}
