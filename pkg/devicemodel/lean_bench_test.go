package devicemodel_test

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// BenchmarkLeanCounters is what lean counters save: the upstream
// allocator's cost per claim on one DGX H100 node under the default policy,
// lean layout ÷ every-counter layout (whole GPUs and shares consuming every
// counter of their GPU, as before), at fill levels 0..8 (GPUs held whole),
// per claim kind of BenchmarkAllocatorCost, as published in full and after
// withdrawal. The two layouts are timed as pairs of calls made back to
// back in alternating order, on a freshly collected heap and in CPU time of
// the calling thread, so neither pays the other's garbage and both see the
// same load from other processes (on a shared 2-core machine, ratios of
// wall-clock medians swung 0.02–40× from run to run); each ratio is the
// median of its pairs' ratios. Bytes allocated per call (the garbage the
// scheduler collects later) are compared too.
//
// Per fill level: <kind>-x, lean ÷ every-counter CPU time as published in
// full; <kind>-w-x, the same after withdrawal; <kind>-B-x and <kind>-w-B-x,
// the same for bytes allocated. The parent logs the ratios averaged over
// the fill levels.
func BenchmarkLeanCounters(b *testing.B) {
	n := simnode.New(b, "dgxh100", "dgxh100")
	lean := build(n, devicemodel.Policy{})
	layouts := []resourceslice.DriverResources{everyCounterLayout(lean), lean}
	ratios := make([][]float64, costFills+1) // [fill][withdraw*len(costKinds)+kind]
	bytes := make([][]float64, costFills+1)
	for k := range costFills + 1 {
		b.Run(fmt.Sprintf("fill=%d", k), func(b *testing.B) {
			// The allocator runs on the calling goroutine: lock it to its
			// thread, whose CPU time is what a call costs, whatever else
			// the machine runs.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var pairs [][2]func() time.Duration // every-counter, lean
			for _, withdraw := range []bool{false, true} {
				for _, kind := range costKinds {
					var pair [2]func() time.Duration
					for i, res := range layouts {
						c := costCluster(b, n, res, k, withdraw)
						pair[i] = func() time.Duration { return clockAllocate(b, c, n.Name, kind.req, threadCPU) }
					}
					pairs = append(pairs, pair)
				}
			}
			ratios[k], bytes[k] = pairRatios(b, pairs)
			for j := range ratios[k] {
				name := costKinds[j%len(costKinds)].name
				if j >= len(costKinds) {
					name += "-w"
				}
				b.ReportMetric(ratios[k][j], name+"-x")
				b.ReportMetric(bytes[k][j], name+"-B-x")
			}
		})
	}
	if ratios[costFills] == nil {
		return // filtered by -bench
	}
	var sum strings.Builder
	for w, title := range []string{"as published in full", "after withdrawal"} {
		for _, m := range []struct {
			what string
			r    [][]float64
		}{{"CPU time", ratios}, {"bytes allocated", bytes}} {
			fmt.Fprintf(&sum, "\nlean ÷ every-counter layout, %s per call, %s, averaged over fill levels 0..%d:", m.what, title, costFills)
			for i, kind := range costKinds {
				j := w*len(costKinds) + i
				var avg float64
				for k := range costFills + 1 {
					avg += m.r[k][j] / float64(costFills+1)
				}
				fmt.Fprintf(&sum, "\n  %-9s %5.2f×  (empty node %5.2f×, full node %5.2f×)", kind.name, avg, m.r[0][j], m.r[costFills][j])
			}
		}
	}
	b.Log(sum.String())
}

// pairRatios makes each pair's calls once to warm the CEL cache and the
// allocator's lazily built state, then b.N rounds of every pair, each pair
// on a freshly collected heap, the every-counter call first in even
// rounds and second in odd ones. The first call after a collection is
// slower (cold caches), so each ratio is of two rounds, one of each order:
// it returns per pair the median over those of lean ÷ every-counter, and
// lean ÷ every-counter bytes allocated by one (warm) call.
func pairRatios(b *testing.B, pairs [][2]func() time.Duration) (cpu, bytes []float64) {
	for _, p := range pairs {
		p[0]()
		p[1]()
		bytes = append(bytes, float64(allocated(p[1]))/float64(allocated(p[0])))
	}
	old := make([][]time.Duration, len(pairs))
	lean := make([][]time.Duration, len(pairs))
	b.ResetTimer()
	for round := range b.N {
		for i, p := range pairs {
			runtime.GC()
			var o, l time.Duration
			if round%2 == 0 {
				o, l = p[0](), p[1]()
			} else {
				l, o = p[1](), p[0]()
			}
			old[i], lean[i] = append(old[i], o), append(lean[i], l)
		}
	}
	b.StopTimer()
	for i := range pairs {
		var r []float64
		for j := 0; j < b.N; j += 2 {
			end := min(j+2, b.N) // b.N is 1 in the framework's first run
			r = append(r, float64(sum(lean[i][j:end]))/float64(sum(old[i][j:end])))
		}
		slices.Sort(r)
		cpu = append(cpu, r[len(r)/2])
	}
	return cpu, bytes
}

// allocated is how many bytes call allocates on the heap.
func allocated(call func() time.Duration) uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	before := m.TotalAlloc
	call()
	runtime.ReadMemStats(&m)
	return m.TotalAlloc - before
}

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}

// threadCPU is the CPU time the calling thread has used.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		panic(fmt.Sprintf("clock_gettime(CLOCK_THREAD_CPUTIME_ID): %v", err))
	}
	return time.Duration(ts.Nano())
}
