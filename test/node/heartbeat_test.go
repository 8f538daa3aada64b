package node

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/handover"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// withHeartbeat renews the heartbeat Lease every probePeriod as pod
// plugin-xyz.
func withHeartbeat(cfg *nodeplugin.Config) {
	cfg.PodNamespace, cfg.PodName = "gpu-dra-driver", "plugin-xyz"
	cfg.HeartbeatPeriod = probePeriod
}

// The plugin renews its heartbeat Lease only while its serving path
// answers: renewals stop while NVML hangs (POST /simulate/event?hang=true)
// and resume when it answers again; they stop for good when the DRA socket
// no longer answers. This is what dra-controller's outage taint relies on.
func TestHeartbeatFollowsServing(t *testing.T) {
	p := startProbed(t, withHeartbeat)
	cfg, client := p.cfg, p.client
	const period = probePeriod

	renewTime, renewing, quiet := p.renewTime, p.renewing, p.quiet
	renewing(t, time.Time{}, "heartbeat Lease created")
	renewing(t, renewTime(), "heartbeat Lease renewed")
	checkHolder(t, client, cfg.PodNamespace)

	p.hang(t, true)
	quiet(t, "NVML hung")
	p.hang(t, false)
	renewing(t, renewTime(), "renewed after NVML answers again")

	// A DRA socket the kubelet can no longer reach: the plugin does not serve.
	if err := os.Remove(filepath.Join(cfg.PluginDataDir, "dra.sock")); err != nil {
		t.Fatal(err)
	}
	quiet(t, "DRA socket gone")
}

// A rolling update's new instance registers and passes its probe checks
// while the old one still owns the node, but it serves nothing yet: it must
// not renew the heartbeat Lease (dra-controller would read a heartbeat of
// an instance that does not serve). Once the old one hands the node over,
// it renews.
func TestHeartbeatWaitsToOwnTheNode(t *testing.T) {
	var old *handover.Lock
	p := startProbed(t, func(cfg *nodeplugin.Config) {
		withHeartbeat(cfg)
		cfg.PodUID = "ne000000-0000-0000-0000-000000000002"
		cfg.ProbeAddress = freeAddress(t)
		// The old instance owns the node.
		var err error
		old, err = handover.Acquire(context.Background(), cfg.PluginDataDir, handover.Owner{PodName: "plugin-old"}, nil)
		if err != nil {
			t.Fatal(err)
		}
	})
	cfg, client := p.cfg, p.client
	ctx := context.Background()
	defer old.Release(ctx)

	eventually(t, 10*time.Second, "new instance ready while it waits", func() bool {
		code, _ := probeGet(t, cfg.ProbeAddress, "/readyz")
		return code == http.StatusOK
	})
	time.Sleep(4 * probePeriod) // several heartbeat rounds with passing checks
	switch l, err := client.CoordinationV1().Leases(cfg.PodNamespace).Get(ctx, vocabulary.HeartbeatLeaseName(nodeName), metav1.GetOptions{}); {
	case err == nil:
		t.Fatalf("the waiting instance wrote the heartbeat Lease: holder %q, renewed %v", ptr.Deref(l.Spec.HolderIdentity, ""), l.Spec.RenewTime)
	case !apierrors.IsNotFound(err):
		t.Fatal(err)
	}
	if o, err := handover.ReadOwner(cfg.PluginDataDir); err != nil || o.PodName != "plugin-old" {
		t.Fatalf("owner while the new instance waits = %+v, %v; want plugin-old", o, err)
	}

	old.Release(ctx)
	eventually(t, 5*probePeriod+10*time.Second, "heartbeat Lease once the instance owns the node", func() bool {
		_, err := client.CoordinationV1().Leases(cfg.PodNamespace).Get(ctx, vocabulary.HeartbeatLeaseName(nodeName), metav1.GetOptions{})
		return err == nil
	})
	checkHolder(t, client, cfg.PodNamespace)
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
