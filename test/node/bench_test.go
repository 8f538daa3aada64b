package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/plugintest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
)

// BenchmarkNodePrepareResources measures NodePrepareResources over the
// plugin's gRPC socket, as the kubelet calls it, for claims of 1 and 8 GPUs,
// one at a time and 8 claims at once. The claim GET goes to a fake clientset
// here; docs/performance.md also has the figures against a real API server.
// Each iteration prepares and then unprepares (untimed) so the next can
// prepare again. Reports p50/p99 per call.
func BenchmarkNodePrepareResources(b *testing.B) {
	for _, tc := range []struct {
		name       string
		request    func(i int) resourceapi.DeviceRequest
		concurrent int
	}{
		{"gpus=1/concurrent=1", gpus(1), 1},
		{"gpus=8/concurrent=1", gpus(8), 1},
		{"gpus=1/concurrent=8", gpus(1), 8},
		// Dynamic MIG: each prepare creates a GPU and compute instance
		// in the simulated NVML, each unprepare destroys them.
		{"mig-1g/concurrent=1", func(int) resourceapi.DeviceRequest {
			return at.Exactly("mig", "mig."+driverName, 1, `device.attributes["gpu.dra.dev"].profile == "1g.10gb"`)
		}, 1},
		{"mig-1g-on-8-gpus/concurrent=8", func(i int) resourceapi.DeviceRequest {
			return at.Exactly("mig", "mig."+driverName, 1, `device.attributes["gpu.dra.dev"].profile == "1g.10gb"`,
				fmt.Sprintf(`device.attributes["gpu.dra.dev"].parentMinor == %d`, i))
		}, 8},
	} {
		b.Run(tc.name, func(b *testing.B) {
			claims, p := benchPlugin(b, tc.request, tc.concurrent)
			defer func() { _ = p.Stop() }()
			ctx := context.Background()
			var latencies []time.Duration
			var mu sync.Mutex
			b.ResetTimer()
			for range b.N {
				var wg sync.WaitGroup
				for _, claim := range claims {
					wg.Add(1)
					go func() {
						defer wg.Done()
						start := time.Now()
						if _, err := p.Kubelet.PrepareOne(ctx, claim); err != nil {
							b.Error(err)
						}
						mu.Lock()
						latencies = append(latencies, time.Since(start))
						mu.Unlock()
					}()
				}
				wg.Wait()
				b.StopTimer()
				for _, claim := range claims {
					if err := p.Kubelet.UnprepareOne(ctx, claim); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
			}
			b.StopTimer()
			slices.Sort(latencies)
			b.ReportMetric(float64(percentile(latencies, 50).Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(percentile(latencies, 99).Microseconds())/1000, "p99-ms")
		})
	}
}

func gpus(n int64) func(int) resourceapi.DeviceRequest {
	return func(int) resourceapi.DeviceRequest { return at.Exactly("gpus", driverName, n) }
}

func benchPlugin(b *testing.B, request func(int) resourceapi.DeviceRequest, count int) ([]*resourceapi.ResourceClaim, *plugintest.Plugin) {
	b.Helper()
	dirs, err := plugintest.NewDirs(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	node := simnode.New(b, machine, nodeName)
	c := at.NewCluster(node.Slices(driverName), deviceclass.DeviceClasses(driverName))
	var claims []*resourceapi.ResourceClaim
	for i := range count {
		claims = append(claims, c.MustAllocate(b, nodeName, at.Claim(fmt.Sprintf("c%d", i), request(i)))[0])
	}
	cfg := dirs.Config(machine, nodeName)
	cfg.KubeClient = plugintest.FakeClient(nodeName, claims...)
	// Logs would interleave with the benchmark's result lines.
	p, err := plugintest.Start(klog.NewContext(context.Background(), logr.Discard()), cfg)
	if err != nil {
		b.Fatal(err)
	}
	return claims, p
}

func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}
