package crash

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var flagSeed = flag.Uint64("seed", 0, "seed of the random-time kills; 0 picks one from the clock (it is logged, and again on failure)")

// killSeed returns -seed, or one from the clock when that is 0, and logs it
// with the command that replays it, now and again if t fails.
func killSeed(t *testing.T) uint64 {
	t.Helper()
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()%1_000_000_000) + 1
	}
	replay := fmt.Sprintf("seed=%d (replay: make crash SEED=%d)", seed, seed)
	t.Log(replay)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log("failed with " + replay)
		}
	})
	return seed
}

// withRandomSteps appends n kills at random moments, drawn from seed, to
// steps. The same seed gives the same schedule; where in the plugin a kill
// lands still depends on timing.
func withRandomSteps(steps []step, n int, seed uint64) []step {
	if testing.Short() {
		n = 2
	}
	rng := rand.New(rand.NewPCG(1, seed))
	steps = slices.Clone(steps)
	for i := range n {
		steps = append(steps, step{prepare: i%2 == 0, delay: time.Duration(rng.IntN(4000)) * time.Microsecond})
	}
	return steps
}

// A seed replays its schedule of random kills, and -seed is the seed used.
func TestKillSeedReplays(t *testing.T) {
	base := []step{{prepare: true, crashAt: "x"}}
	a, b := withRandomSteps(base, 12, 42), withRandomSteps(base, 12, 42)
	if !slices.Equal(a, b) {
		t.Fatalf("seed 42 gave two schedules:\n%v\n%v", a, b)
	}
	if c := withRandomSteps(base, 12, 43); slices.Equal(a, c) {
		t.Fatalf("seeds 42 and 43 gave the same schedule %v", a)
	}

	defer func(old uint64) { *flagSeed = old }(*flagSeed)
	*flagSeed = 12345
	if got := killSeed(t); got != 12345 {
		t.Fatalf("killSeed with -seed=12345 = %d", got)
	}
	*flagSeed = 0
	if got := killSeed(t); got == 0 {
		t.Fatal("killSeed without -seed = 0, want one from the clock")
	}
}
