package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// The plugin renews its heartbeat Lease only while its serving path
// answers: renewals stop while NVML hangs (POST /simulate/event?hang=true)
// and resume when it answers again; they stop for good when the DRA socket
// no longer answers. This is what dra-controller's outage taint relies on.
func TestHeartbeatFollowsServing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dirs, _, claims, _ := setup(t, map[string]int64{"held": 1})
	cfg := dirs.Config(machine, nodeName)
	client := apiserver.NodeClient(nodeName, claims["held"])
	cfg.KubeClient = client
	cfg.MetricsAddress = freeAddress(t) // for /simulate/event
	cfg.PodNamespace, cfg.PodName = "gpu-dra-driver", "plugin-xyz"
	// Checks must answer within the timeout on a loaded machine; only a
	// hung one reaches it.
	const period = time.Second
	cfg.ProbePeriod, cfg.ProbeTimeout, cfg.HeartbeatPeriod = period, 500*time.Millisecond, period
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released { // a hung NVML would hang the plugin's shutdown
			injectEvent(t, cfg.MetricsAddress, "hang=false")
		}
		_ = p.Stop()
	}()

	renewTime := func() time.Time {
		l, err := client.CoordinationV1().Leases(cfg.PodNamespace).Get(ctx, vocabulary.HeartbeatLeaseName(nodeName), metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			return time.Time{}
		}
		return l.Spec.RenewTime.Time
	}
	// renewing waits until the Lease is renewed after since.
	renewing := func(since time.Time, what string) {
		t.Helper()
		eventually(t, 5*period+5*time.Second, what, func() bool { return renewTime().After(since) })
	}
	// quiet checks that the Lease is not renewed for several periods.
	quiet := func(what string) {
		t.Helper()
		time.Sleep(3 * period) // the round in flight may still renew
		last := renewTime()
		time.Sleep(4 * period)
		if got := renewTime(); !got.Equal(last) {
			t.Errorf("%s: Lease renewed at %s, after %s", what, got.Format(time.RFC3339Nano), last.Format(time.RFC3339Nano))
		}
	}
	renewing(time.Time{}, "heartbeat Lease created")
	renewing(renewTime(), "heartbeat Lease renewed")
	checkHolder(t, client, cfg.PodNamespace)

	injectEvent(t, cfg.MetricsAddress, "hang=true")
	quiet("NVML hung")
	injectEvent(t, cfg.MetricsAddress, "hang=false")
	released = true
	renewing(renewTime(), "renewed after NVML answers again")

	// A DRA socket the kubelet can no longer reach: the plugin does not serve.
	if err := os.Remove(filepath.Join(cfg.PluginDataDir, "dra.sock")); err != nil {
		t.Fatal(err)
	}
	quiet("DRA socket gone")
}

func checkHolder(t *testing.T, client *fake.Clientset, ns string) {
	t.Helper()
	l, err := client.CoordinationV1().Leases(ns).Get(context.Background(), vocabulary.HeartbeatLeaseName(nodeName), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != "plugin-xyz" || l.Labels[vocabulary.LabelHeartbeat] != "true" {
		t.Errorf("heartbeat Lease: holder %v, labels %v", h, l.Labels)
	}
}
