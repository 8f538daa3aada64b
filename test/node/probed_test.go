package node

import (
	"context"
	"strconv"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// probePeriod is how often a probed plugin runs its probe checks.
const probePeriod = time.Second

// probed is a plugin whose probe checks run every probePeriod, with one
// claim "held" allocated, and whose NVML a test hangs and releases (POST
// /simulate/event on its metrics address).
type probed struct {
	*inprocess.Plugin
	cfg    *nodeplugin.Config
	client *fake.Clientset
	claims map[string]*resourceapi.ResourceClaim
	hung   bool
	wedged bool // checkpoint saves hang
}

// startProbed starts a probed plugin, with configure's changes to its
// config, and stops it when the test ends.
func startProbed(t *testing.T, configure func(*nodeplugin.Config)) *probed {
	t.Helper()
	dirs, _, claims, _ := setup(t, map[string]int64{"held": 1})
	cfg := dirs.Config(machine, nodeName)
	client := apiserver.NodeClient(nodeName, claims["held"])
	cfg.KubeClient = client
	cfg.MetricsAddress = freeAddress(t) // for /simulate/event
	// A healthy check must answer within the timeout on a loaded machine
	// (CI runs this beside other tests on 2 cores): only a hung one reaches it.
	cfg.ProbePeriod, cfg.ProbeTimeout = probePeriod, 500*time.Millisecond
	configure(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	pp := &probed{Plugin: p, cfg: cfg, client: client, claims: claims}
	t.Cleanup(func() {
		defer cancel()
		if pp.hung { // a hung NVML would hang the plugin's shutdown
			pp.hang(t, false)
		}
		if pp.wedged { // so would a prepare hung in its save
			pp.hangSaves(t, false)
		}
		_ = p.Stop()
	})
	return pp
}

// hang makes the plugin's NVML calls hang, or answer again.
func (p *probed) hang(t *testing.T, hung bool) {
	t.Helper()
	injectEvent(t, p.cfg.MetricsAddress, "hang="+strconv.FormatBool(hung))
	p.hung = hung
}

// hangSaves makes the plugin's checkpoint saves hang, or go on.
func (p *probed) hangSaves(t *testing.T, hung bool) {
	t.Helper()
	injectEvent(t, p.cfg.MetricsAddress, "hangsave="+strconv.FormatBool(hung))
	p.wedged = hung
}

// renewTime returns when the heartbeat Lease was last renewed; zero when
// there is none.
func (p *probed) renewTime() time.Time {
	l, err := p.client.CoordinationV1().Leases(p.cfg.PodNamespace).Get(context.Background(), vocabulary.HeartbeatLeaseName(nodeName), metav1.GetOptions{})
	if err != nil || l.Spec.RenewTime == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Time
}

// renewing waits until the Lease is renewed after since.
func (p *probed) renewing(t *testing.T, since time.Time, what string) {
	t.Helper()
	eventually(t, 5*probePeriod+5*time.Second, what, func() bool { return p.renewTime().After(since) })
}

// quiet checks that the Lease is not renewed for several periods.
func (p *probed) quiet(t *testing.T, what string) {
	t.Helper()
	time.Sleep(3 * probePeriod) // the round in flight may still renew
	last := p.renewTime()
	time.Sleep(4 * probePeriod)
	if got := p.renewTime(); !got.Equal(last) {
		t.Errorf("%s: Lease renewed at %s, after %s", what, got.Format(time.RFC3339Nano), last.Format(time.RFC3339Nano))
	}
}
