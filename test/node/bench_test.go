package node

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
)

// BenchmarkNodePrepareResources measures NodePrepareResources over the
// plugin's gRPC socket, as the kubelet calls it, for claims of 1 and 8 GPUs,
// one at a time and 8 claims at once, and for dynamic MIG devices. The
// kubelet helper GETs each claim through the plugin's client: from a fake
// clientset by default, from a real kube-apiserver when BENCH_KUBECONFIG
// names one (hack/cluster/up.sh prints it), which shows API-client
// throttling too. Each iteration prepares and then unprepares (untimed) so
// the next can prepare again. Reports p50/p99 per call and prepared claims
// per second of rounds. The CDI specs go to a tmpfs (/dev/shm), as they do
// on a node (/var/run/cdi), unless BENCH_CDI_ON_DISK is set. Against the
// fake clientset, every request waits for the token bucket a real client
// of the plugin's default --kube-api-qps and --kube-api-burst has
// (client=defaults), or for nothing (client=unlimited).
func BenchmarkNodePrepareResources(b *testing.B) {
	kubeconfig := os.Getenv("BENCH_KUBECONFIG")
	for _, tc := range []struct {
		name       string
		request    func(i int) resourceapi.DeviceRequest
		concurrent int
		unlimited  bool
	}{
		{"gpus=1/concurrent=1", gpus(1), 1, false},
		{"gpus=1/concurrent=1/client=unlimited", gpus(1), 1, true},
		{"gpus=8/concurrent=1", gpus(8), 1, false},
		{"gpus=1/concurrent=8", gpus(1), 8, false},
		{"gpus=1/concurrent=8/client=unlimited", gpus(1), 8, true},
		// Dynamic MIG: each prepare creates a GPU and compute instance
		// in the simulated NVML, each unprepare destroys them.
		{"mig-1g/concurrent=1", func(int) resourceapi.DeviceRequest {
			return at.Exactly("mig", "mig."+driverName, 1, `device.attributes["gpu.dra.dev"].profile == "1g.10gb"`)
		}, 1, false},
		{"mig-1g-on-8-gpus/concurrent=8", func(i int) resourceapi.DeviceRequest {
			return at.Exactly("mig", "mig."+driverName, 1, `device.attributes["gpu.dra.dev"].profile == "1g.10gb"`,
				fmt.Sprintf(`device.attributes["gpu.dra.dev"].parentMinor == %d`, i))
		}, 8, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			claims, p := benchPlugin(b, tc.request, tc.concurrent, kubeconfig, !tc.unlimited)
			defer func() { _ = p.Stop() }()
			ctx := context.Background()
			var latencies []time.Duration
			var mu sync.Mutex
			var rounds time.Duration
			b.ResetTimer()
			for range b.N {
				roundStart := time.Now()
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
				rounds += time.Since(roundStart)
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
			b.ReportMetric(float64(len(latencies))/rounds.Seconds(), "claims/s")
		})
	}
}

func gpus(n int64) func(int) resourceapi.DeviceRequest {
	return func(int) resourceapi.DeviceRequest { return at.Exactly("gpus", driverName, n) }
}

func benchPlugin(b *testing.B, request func(int) resourceapi.DeviceRequest, count int, kubeconfig string, limited bool) ([]*resourceapi.ResourceClaim, *inprocess.Plugin) {
	b.Helper()
	dirs, err := pluginrun.NewDirs(b.TempDir())
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
	if os.Getenv("BENCH_CDI_ON_DISK") == "" {
		cfg.CDIDir = tmpfsDir(b)
	}
	if kubeconfig == "" {
		client := apiserver.NodeClient(nodeName, claims...)
		if limited {
			limitLikeDefaultClient(b, client)
		}
		cfg.KubeClient = client
	} else {
		cfg.Kubeconfig = kubeconfig
		cfg.KubeAPIQPS, cfg.KubeAPIBurst = defaultClientLimits(b)
		if !limited {
			cfg.KubeAPIQPS, cfg.KubeAPIBurst = 1e6, 1e6
		}
		claims = storeClaims(b, kubeconfig, claims)
	}
	// Logs would interleave with the benchmark's result lines.
	p, err := inprocess.Start(klog.NewContext(context.Background(), logr.Discard()), cfg)
	if err != nil {
		b.Fatal(err)
	}
	return claims, p
}

// limitLikeDefaultClient makes every request to client wait as the rate
// limiter of a real client of the plugin's default --kube-api-qps and
// --kube-api-burst (client-go's token bucket) makes it wait.
func limitLikeDefaultClient(b *testing.B, client *fake.Clientset) {
	b.Helper()
	qps, burst := defaultClientLimits(b)
	limiter := flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	client.PrependReactor("*", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		limiter.Accept()
		return false, nil, nil
	})
	client.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) {
		limiter.Accept()
		return false, nil, nil
	})
}

// defaultClientLimits are the defaults of the plugin's --kube-api-qps and
// --kube-api-burst.
func defaultClientLimits(b *testing.B) (float32, int) {
	b.Helper()
	fs := pflag.NewFlagSet("plugin", pflag.ContinueOnError)
	new(nodeplugin.Config).AddFlags(fs)
	qps, err := strconv.ParseFloat(fs.Lookup("kube-api-qps").DefValue, 32)
	if err != nil {
		b.Fatal(err)
	}
	burst, err := strconv.Atoi(fs.Lookup("kube-api-burst").DefValue)
	if err != nil {
		b.Fatal(err)
	}
	return float32(qps), burst
}

// tmpfsDir is a fresh directory on /dev/shm, a tmpfs like a node's
// /var/run/cdi; without /dev/shm, one beside the test's other files.
func tmpfsDir(b *testing.B) string {
	b.Helper()
	dir, err := os.MkdirTemp("/dev/shm", "bench-cdi-")
	if err != nil {
		b.Logf("No tmpfs for CDI specs, using the test's directory: %v", err)
		return b.TempDir()
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// storeClaims creates the claims, allocated, in a fresh namespace of a real
// API server, with the bench node they are allocated on; all removed after.
func storeClaims(b *testing.B, kubeconfig string, claims []*resourceapi.ResourceClaim) []*resourceapi.ResourceClaim {
	b.Helper()
	ctx := context.Background()
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(restConfig)
	ns, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-prepare-"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}) })
	if _, err := client.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.CoreV1().Nodes().Delete(ctx, nodeName, metav1.DeleteOptions{}) })
	var out []*resourceapi.ResourceClaim
	for _, c := range claims {
		stored := c.DeepCopy()
		stored.Namespace, stored.UID, stored.ResourceVersion = ns.Name, "", ""
		stored.Status = resourceapi.ResourceClaimStatus{}
		created, err := client.ResourceV1().ResourceClaims(ns.Name).Create(ctx, stored, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		created.Status.Allocation = c.Status.Allocation
		created, err = client.ResourceV1().ResourceClaims(ns.Name).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, created)
	}
	return out
}

func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}
