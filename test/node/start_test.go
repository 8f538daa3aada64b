package node

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
)

// lockedBuffer collects the log lines of concurrent goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A start discovers the GPUs once: the health monitor, the metrics and the
// published device model share that one discovery (each NVML walk of a
// node costs start-up time, and two could disagree).
func TestStartDiscoversOnce(t *testing.T) {
	dirs, _, _, _ := setup(t, nil)
	cfg := dirs.Config(machine, nodeName)
	client := apiserver.NodeClient(nodeName)
	cfg.KubeClient = client
	cfg.MetricsAddress = freeAddress(t)
	var logs lockedBuffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(2), textlogger.Output(&logs)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "slices published", func() bool {
		l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) > 0
	})
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(logs.String(), `"Discovered GPUs"`); n != 1 {
		t.Errorf("the start discovered the GPUs %d times, want once", n)
	}
}
