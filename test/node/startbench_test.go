package node

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
)

// BenchmarkPluginStart measures a start of the plugin on a fresh simulated
// node, in the test's process, against a fake API server: until the
// kubelet stand-in is registered, and until every ResourceSlice the node
// publishes is in the API server. Reports p50 of each.
func BenchmarkPluginStart(b *testing.B) {
	want := len(simnode.New(b, machine, nodeName).Slices(driverName))
	var registered, visible []time.Duration
	for range b.N {
		dirs, err := pluginrun.NewDirs(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		cfg := dirs.Config(machine, nodeName)
		client := apiserver.NodeClient(nodeName)
		cfg.KubeClient = client
		start := time.Now()
		p, err := inprocess.Start(klog.NewContext(context.Background(), logr.Discard()), cfg)
		if err != nil {
			b.Fatal(err)
		}
		registered = append(registered, time.Since(start))
		for {
			list, err := client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if len(list.Items) >= want {
				break
			}
			if time.Since(start) > 30*time.Second {
				b.Fatalf("%d of %d ResourceSlices after 30s", len(list.Items), want)
			}
			time.Sleep(time.Millisecond)
		}
		visible = append(visible, time.Since(start))
		b.StopTimer()
		if err := p.Stop(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	slices.Sort(registered)
	slices.Sort(visible)
	b.ReportMetric(float64(percentile(registered, 50).Microseconds())/1000, "registered-p50-ms")
	b.ReportMetric(float64(percentile(visible, 50).Microseconds())/1000, "slices-p50-ms")
}
