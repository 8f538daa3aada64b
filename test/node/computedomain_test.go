package node

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/imexdomain"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/imexd"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// domainRack is a simulated rack whose trays run compute domain daemons:
// one dynamic client holds the ComputeDomains all trays share, each tray
// a loopback address.
type domainRack struct {
	t                   *testing.T
	imexSim             string
	serverPort, cmdPort int
	cds                 *dynamicfake.FakeDynamicClient
	dirs                map[string]pluginrun.Dirs
	clients             map[string]*fake.Clientset
	stops               map[string]func() error
}

var trayIPs = map[string]string{"tray-1": "127.0.0.2", "tray-2": "127.0.0.3", "tray-3": "127.0.0.4"}

func newDomainRack(t *testing.T, cds ...*gpuv1beta1.ComputeDomain) *domainRack {
	t.Helper()
	bin, err := pluginrun.BuildIMEX(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	client, err := apiserver.ComputeDomains(cds...)
	if err != nil {
		t.Fatal(err)
	}
	r := &domainRack{t: t, imexSim: bin, cds: client, dirs: map[string]pluginrun.Dirs{}, clients: map[string]*fake.Clientset{}, stops: map[string]func() error{}}
	r.serverPort, r.cmdPort = freePort(t), freePort(t)
	return r
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("cannot listen on 127.0.0.2: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// start starts (or restarts, over the same directories) node's plugin.
func (r *domainRack) start(node string, claims ...*resourceapi.ResourceClaim) *inprocess.Plugin {
	t := r.t
	t.Helper()
	dirs, ok := r.dirs[node]
	if !ok {
		var err error
		if dirs, err = pluginrun.NewDirs(t.TempDir()); err != nil {
			t.Fatal(err)
		}
		r.dirs[node] = dirs
		t.Cleanup(func() { killDaemons(dirs) })
	}
	cfg := dirs.Config("gb200nvl72", node)
	cfg.SimulateNodeMachines = rackNodes
	cfg.IMEX = nodepluginIMEX(r, node)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	r.clients[node] = apiserver.NodeClient(node, claims...)
	cfg.KubeClient = r.clients[node]
	p, err := inprocess.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start plugin on %s: %v", node, err)
	}
	stop := sync.OnceValue(p.Stop)
	r.stops[node] = stop
	t.Cleanup(func() { _ = stop() })
	return p
}

// stop stops node's plugin (once: a second Stop waits for its timeout).
func (r *domainRack) stop(node string) {
	r.t.Helper()
	if err := r.stops[node](); err != nil {
		r.t.Fatal(err)
	}
}

// killDaemons ends the IMEX daemons a test left (they outlive the plugin
// by design), by the PIDs their records name.
func killDaemons(dirs pluginrun.Dirs) {
	recs, _ := filepath.Glob(filepath.Join(dirs.PluginData, "imex", "*", "domain.json"))
	for _, rec := range recs {
		var r struct{ PID int }
		if data, err := os.ReadFile(rec); err == nil && json.Unmarshal(data, &r) == nil && r.PID > 0 {
			_ = syscall.Kill(r.PID, syscall.SIGKILL)
		}
	}
}

// ctl runs nvidia-imex-ctl -N against node's daemon of domain.
func (r *domainRack) ctl(node string, domain types.UID) string {
	var out bytes.Buffer
	imexd.Main([]string{imexd.CtlName, "-c", filepath.Join(r.dirs[node].PluginData, "imex", string(domain), "config.cfg"), "-N"}, &out, &out)
	return out.String()
}

// cd reads the domain.
func (r *domainRack) cd(name string) *gpuv1beta1.ComputeDomain {
	r.t.Helper()
	u, err := r.cds.Resource(gpuv1beta1.ComputeDomainResource).Namespace("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	cd := &gpuv1beta1.ComputeDomain{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cd); err != nil {
		r.t.Fatal(err)
	}
	return cd
}

// states returns the daemon state of each node's entry of the domain.
func (r *domainRack) states(name string) map[string]gpuv1beta1.DaemonState {
	out := map[string]gpuv1beta1.DaemonState{}
	for _, e := range r.cd(name).Status.Nodes {
		out[e.Name] = e.Daemon.State
	}
	return out
}

func computeDomain(name string, uid types.UID) *gpuv1beta1.ComputeDomain {
	return &gpuv1beta1.ComputeDomain{
		TypeMeta:   metav1.TypeMeta{APIVersion: gpuv1beta1.GroupVersion.String(), Kind: "ComputeDomain"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid},
		Spec:       gpuv1beta1.ComputeDomainSpec{Channel: gpuv1beta1.ComputeDomainChannel{ResourceClaimName: name + "-channel"}},
	}
}

// channelClaim is a domain's shared channel claim as the scheduler
// allocates it: one channel of the clique's pool, the domain's config.
func channelClaim(domain, clique string, channel int) *resourceapi.ResourceClaim {
	params := `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"ComputeDomainChannelConfig","domainName":"` + domain + `"}`
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: domain + "-channel", Namespace: "default", UID: types.UID(domain + "-channel-uid")},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "channel", Driver: driverName, Pool: vocabulary.ChannelPoolName(clique), Device: vocabulary.ChannelDeviceName(channel),
			}},
			Config: []resourceapi.DeviceAllocationConfiguration{{
				Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"channel"},
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
					Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(params)},
				}},
			}},
		}}},
	}
}

// cdiHas reports whether a CDI spec of node names the device node.
func (r *domainRack) cdiHas(node, devNode string) bool {
	specs, _ := filepath.Glob(filepath.Join(r.dirs[node].CDI, "*"))
	for _, s := range specs {
		if data, err := os.ReadFile(s); err == nil && strings.Contains(string(data), devNode) {
			return true
		}
	}
	return false
}

// Two trays of rack-a prepare a domain's channel claim: both run the
// domain's daemon, connected to each other, and write their status
// entries; the container gets the channel's node. Rack-b's tray refuses
// the claim, a second domain is refused on a busy tray, unpreparing one
// tray stops its daemon and drops its entry, and a restarted plugin
// adopts its daemon.
func TestComputeDomainChannel(t *testing.T) {
	ctx := context.Background()
	_, s1 := startTray(t, "tray-1")
	_, s3 := startTray(t, "tray-3")
	cliqueA, cliqueB := clique(t, "tray-1", s1), clique(t, "tray-3", s3)
	const uid = types.UID("training-uid")
	r := newDomainRack(t, computeDomain("training", uid), computeDomain("other", "other-uid"))
	claim := channelClaim("training", cliqueA, 3)
	other := channelClaim("other", cliqueA, 4)
	p1 := r.start("tray-1", claim, other)
	p2 := r.start("tray-2", claim)
	p3 := r.start("tray-3", claim)

	for _, p := range []*inprocess.Plugin{p1, p2} {
		if ids, err := p.Kubelet.PrepareOne(ctx, claim); err != nil || len(ids) != 1 {
			t.Fatalf("prepare the channel claim: %v, %d CDI devices", err, len(ids))
		}
	}
	for _, node := range []string{"tray-1", "tray-2"} {
		if !r.cdiHas(node, "/dev/nvidia-caps-imex-channels/channel3") {
			t.Errorf("%s: no CDI spec gives /dev/nvidia-caps-imex-channels/channel3", node)
		}
	}
	eventually(t, 20*time.Second, "both daemons connected, domain UP", func() bool {
		s := r.states("training")
		return s["tray-1"] == gpuv1beta1.DaemonConnected && s["tray-2"] == gpuv1beta1.DaemonConnected &&
			strings.Contains(r.ctl("tray-1", uid), "Domain State: UP") && strings.Count(r.ctl("tray-1", uid), "READY") == 2
	})

	// tray-2's daemon dies while its plugin is down: tray-1 reports the lost
	// peer in its entry and an Event; the restarted plugin starts the
	// daemon again and the domain reconnects.
	r.stop("tray-2")
	pid2 := daemonPID(t, r, "tray-2", uid)
	_ = syscall.Kill(pid2, syscall.SIGKILL)
	eventually(t, 20*time.Second, "tray-1 reports tray-2 lost", func() bool {
		for _, e := range r.cd("training").Status.Nodes {
			if e.Name == "tray-1" {
				return e.Daemon.State == gpuv1beta1.DaemonDisconnected && slices.Equal(e.Daemon.UnreachablePeers, []string{"tray-2"})
			}
		}
		return false
	})
	events, err := r.clients["tray-1"].CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil || len(events.Items) == 0 || events.Items[0].Reason != imexdomain.EventPeerUnreachable ||
		events.Items[0].InvolvedObject.Name != "training" || !strings.Contains(events.Items[0].Message, "tray-2") {
		t.Errorf("events on tray-1's client: %v %+v, want %s on training naming tray-2", err, events, imexdomain.EventPeerUnreachable)
	}
	p2 = r.start("tray-2", claim)
	connected := func() bool {
		s := r.states("training")
		return s["tray-1"] == gpuv1beta1.DaemonConnected && s["tray-2"] == gpuv1beta1.DaemonConnected
	}
	eventually(t, 20*time.Second, "the restarted plugin's daemon reconnects", connected)
	// A daemon that dies while its plugin runs is started again.
	pid2 = daemonPID(t, r, "tray-2", uid)
	_ = syscall.Kill(pid2, syscall.SIGKILL)
	eventually(t, 20*time.Second, "tray-2's plugin restarts its daemon", func() bool {
		return daemonPIDOrZero(r, "tray-2", uid) != pid2 && connected()
	})

	if _, err := p3.Kubelet.PrepareOne(ctx, claim); err == nil || !strings.Contains(err.Error(), "clique "+cliqueA) || !strings.Contains(err.Error(), cliqueB) {
		t.Errorf("prepare on rack-b's tray: %v, want the clique error naming both cliques", err)
	}
	if _, err := p1.Kubelet.PrepareOne(ctx, other); err == nil || !strings.Contains(err.Error(), "serves ComputeDomain default/training") {
		t.Errorf("prepare a second domain's channel on a busy tray: %v, want an error naming default/training", err)
	}

	if err := p2.Kubelet.UnprepareOne(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.dirs["tray-2"].PluginData, "imex", string(uid))); !os.IsNotExist(err) {
		t.Errorf("tray-2's daemon files after unprepare: %v, want gone", err)
	}
	eventually(t, 20*time.Second, "tray-2's entry dropped, tray-1 alone connected", func() bool {
		s := r.states("training")
		_, has2 := s["tray-2"]
		return !has2 && s["tray-1"] == gpuv1beta1.DaemonConnected
	})

	// A restart adopts the running daemon.
	pid := daemonPID(t, r, "tray-1", uid)
	r.stop("tray-1")
	p1 = r.start("tray-1", claim, other)
	if got := daemonPID(t, r, "tray-1", uid); got != pid || syscall.Kill(pid, 0) != nil {
		t.Errorf("after a restart the daemon is %d, want %d adopted and running", got, pid)
	}
	if err := p1.Kubelet.UnprepareOne(ctx, claim); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "tray-1's daemon stopped and entry dropped", func() bool {
		return len(r.cd("training").Status.Nodes) == 0 && syscall.Kill(pid, 0) != nil
	})
	// The node serves the other domain now.
	if _, err := p1.Kubelet.PrepareOne(ctx, other); err != nil {
		t.Errorf("prepare the other domain's channel on the free tray: %v", err)
	}
	if err := p1.Kubelet.UnprepareOne(ctx, other); err != nil {
		t.Fatal(err)
	}
}

func daemonPID(t *testing.T, r *domainRack, node string, uid types.UID) int {
	t.Helper()
	pid := daemonPIDOrZero(r, node, uid)
	if pid == 0 {
		t.Fatalf("%s: no daemon PID recorded", node)
	}
	return pid
}

// daemonPIDOrZero is the PID node's daemon record names, 0 for none.
func daemonPIDOrZero(r *domainRack, node string, uid types.UID) int {
	data, err := os.ReadFile(filepath.Join(r.dirs[node].PluginData, "imex", string(uid), "domain.json"))
	var rec struct{ PID int }
	if err == nil && json.Unmarshal(data, &rec) == nil {
		return rec.PID
	}
	return 0
}

func nodepluginIMEX(r *domainRack, node string) nodeplugin.IMEXConfig {
	return nodeplugin.IMEXConfig{
		NodeIP: trayIPs[node], Daemon: r.imexSim, ServerPort: r.serverPort, CmdPort: r.cmdPort,
		PollPeriod: 100 * time.Millisecond, DynamicClient: r.cds,
	}
}

// Without the ComputeDomain CRD (the watch cannot list) the plugin still
// starts and serves; a channel claim fails at the domain's lookup.
func TestComputeDomainsWithoutCRD(t *testing.T) {
	_, s1 := startTray(t, "tray-1")
	r := newDomainRack(t)
	gone := func(action k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(gpuv1beta1.ComputeDomainResource.GroupResource(), "")
	}
	r.cds.PrependReactor("list", "*", gone)
	r.cds.PrependReactor("get", "*", gone)
	r.cds.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, nil, apierrors.NewNotFound(gpuv1beta1.ComputeDomainResource.GroupResource(), "")
	})
	claim := channelClaim("training", clique(t, "tray-1", s1), 3)
	p := r.start("tray-1", claim)
	if _, err := p.Kubelet.PrepareOne(context.Background(), claim); err == nil || !strings.Contains(err.Error(), "ComputeDomain default/training") {
		t.Errorf("prepare without the CRD: %v, want the lookup's error naming default/training", err)
	}
}
