// Package imexdomain joins this node to the ComputeDomains whose channel
// claims it prepares (docs/compute-domains.md): it looks a domain up, runs
// the domain's IMEX daemon through imex.Manager, writes this node's entry
// of the domain's status.nodes (server-side apply, field manager
// gpu.dra.dev/node-<node>), keeps the daemon's peers to the addresses of
// the entries there, and polls the daemon (nvidia-imex-ctl -N) for its
// state, recording a lost peer as an Event on the domain and in a metric.
package imexdomain

import (
	"context"
	"fmt"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/imex"
)

// Domain is a ComputeDomain as a channel record names it: the domain in
// the channel claim's namespace, its UID (the daemon's key) and the
// channel.
type Domain struct {
	Namespace, Name string
	UID             types.UID
	Channel         int
}

// Options configure a Node.
type Options struct {
	// Manager runs the daemon; its daemon listens on NodeIP.
	Manager *imex.Manager
	// Client reads ComputeDomains and applies their status.
	Client dynamic.Interface
	// Events records the IMEXPeerUnreachable events; nil records none.
	Events corev1client.EventsGetter
	// NodeName names this node's status entry; NodeIP is its address.
	NodeName, NodeIP string
	// ProcDevices is where the channels' major is read ("" is
	// DefaultProcDevices) and ChannelStandIn is a simulated driver root's
	// device number (ChannelNodes).
	ProcDevices    string
	ChannelStandIn uint64
	// Ctl is nvidia-imex-ctl.
	Ctl string
	// PollPeriod is how often the daemon is polled and the peers
	// checked; 0 means 5 s.
	PollPeriod time.Duration
}

// Node is this node's part of the compute domains it serves.
type Node struct {
	opts    Options
	metrics *Metrics
	nodes   *ChannelNodes

	mu     sync.Mutex
	clique string
	// joined is the domain whose daemon runs here, by UID; zero when none.
	joined Domain
	// last is the status entry last applied, to apply only changes;
	// lost the peers last reported unreachable.
	last *gpuv1beta1.ComputeDomainNode
	lost map[string]bool

	informer cache.SharedIndexInformer
}

// New returns a node; Run runs its watch and poller.
func New(opts Options) *Node {
	if opts.PollPeriod == 0 {
		opts.PollPeriod = 5 * time.Second
	}
	n := &Node{opts: opts, metrics: newMetrics(opts.NodeName), nodes: &ChannelNodes{
		ProcDevices: opts.ProcDevices, StandIn: opts.ChannelStandIn,
	}}
	factory := dynamicinformer.NewDynamicSharedInformerFactory(opts.Client, 10*time.Minute)
	n.informer = factory.ForResource(gpuv1beta1.ComputeDomainResource).Informer()
	return n
}

// Metrics are the node's metrics, for the plugin's registry.
func (n *Node) Metrics() *Metrics { return n.metrics }

// SetClique sets this node's clique once discovery found it.
func (n *Node) SetClique(clique string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.clique = clique
}

// Clique is this node's NVLink clique, "" when none.
func (n *Node) Clique() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.clique
}

// DeviceNode is channel i's device node for a container, by its numbers
// (ChannelNodes.Device).
func (n *Node) DeviceNode(i int) (cdi.CharDevice, error) { return n.nodes.Device(i) }

// Lookup reads ComputeDomain namespace/name from the API server: its UID
// and the channel number reserved for it (status.channel).
func (n *Node) Lookup(ctx context.Context, namespace, name string) (*gpuv1beta1.ComputeDomain, error) {
	u, err := n.opts.Client.Resource(gpuv1beta1.ComputeDomainResource).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("ComputeDomain %s/%s (the channel config's domainName): %w", namespace, name, err)
	}
	cd := &gpuv1beta1.ComputeDomain{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cd); err != nil {
		return nil, fmt.Errorf("ComputeDomain %s/%s: %w", namespace, name, err)
	}
	return cd, nil
}

// Join starts or joins the domain's daemon for claim, with the peers the
// domain's status lists and this node, and applies this node's entry.
func (n *Node) Join(ctx context.Context, d Domain, claim string) error {
	n.mu.Lock()
	busy := n.joined
	n.mu.Unlock()
	if busy.UID != "" && busy.UID != d.UID {
		return fmt.Errorf("ComputeDomain %s/%s: this node's IMEX daemon serves ComputeDomain %s/%s (UID %s); a node serves one compute domain at a time",
			d.Namespace, d.Name, busy.Namespace, busy.Name, busy.UID)
	}
	peers, _ := n.peersOf(ctx, d)
	if err := n.opts.Manager.Acquire(ctx, string(d.UID), claim, peers); err != nil {
		return fmt.Errorf("ComputeDomain %s/%s: %w", d.Namespace, d.Name, err)
	}
	n.mu.Lock()
	n.joined, n.last, n.lost = d, nil, nil
	n.mu.Unlock()
	if err := n.applyEntry(ctx, d, &gpuv1beta1.DaemonStatus{State: gpuv1beta1.DaemonStarting}); err != nil {
		// The daemon runs; the poller applies the entry again.
		klog.FromContext(ctx).Error(err, "Write this node's compute domain status entry", "domain", klog.KRef(d.Namespace, d.Name))
	}
	return nil
}

// Leave releases claim's hold on the domain's daemon; with the last claim
// the daemon stops and this node's status entry goes.
func (n *Node) Leave(ctx context.Context, d Domain, claim string) error {
	if err := n.opts.Manager.Release(ctx, string(d.UID), claim); err != nil {
		return fmt.Errorf("ComputeDomain %s/%s: %w", d.Namespace, d.Name, err)
	}
	if active, _ := n.opts.Manager.Active(); active == string(d.UID) {
		return nil
	}
	n.mu.Lock()
	if n.joined.UID == d.UID {
		n.joined, n.last, n.lost = Domain{}, nil, nil
	}
	n.mu.Unlock()
	n.metrics.forget(d)
	return n.dropEntry(ctx, d)
}

// Recover, at start, adopts or restarts the daemon the checkpoint's
// channels hold and stops one no claim holds (imex.Manager.Recover); held
// are the recorded domains with their claims. The poller then drops the
// status entries of domains this node no longer serves.
func (n *Node) Recover(ctx context.Context, held map[Domain][]string) error {
	byUID := map[string][]string{}
	for d, claims := range held {
		byUID[string(d.UID)] = append(byUID[string(d.UID)], claims...)
	}
	if err := n.opts.Manager.Recover(ctx, byUID); err != nil {
		return err
	}
	active, _ := n.opts.Manager.Active()
	for d := range held {
		if string(d.UID) == active {
			n.mu.Lock()
			n.joined = d
			n.mu.Unlock()
		}
	}
	return nil
}

// Run runs the ComputeDomain watch and the poller until ctx ends; the
// plugin counts it among the goroutines that change node state (the
// daemon's peers, a restarted daemon), which end before the node is handed
// over. It does not wait for the watch: without the CRD (or the RBAC) the
// plugin still serves GPUs, and its channel prepares fail at the lookup;
// the poller follows the peers once the watch has synced.
func (n *Node) Run(ctx context.Context) {
	go n.informer.Run(ctx.Done())
	// A change of any domain's nodes may change the peers: poll at once.
	kick := make(chan struct{}, 1)
	notify := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	if _, err := n.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: notify, UpdateFunc: func(_, o any) { notify(o) }, DeleteFunc: notify,
	}); err != nil {
		klog.FromContext(ctx).Error(err, "Watch ComputeDomains; polling only")
	}
	ticker := time.NewTicker(n.opts.PollPeriod)
	defer ticker.Stop()
	for {
		n.reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-kick:
		}
	}
}

// cached returns the domain from the informer's cache.
func (n *Node) cached(d Domain) (*gpuv1beta1.ComputeDomain, bool) {
	obj, ok, err := n.informer.GetStore().GetByKey(d.Namespace + "/" + d.Name)
	if err != nil || !ok {
		return nil, false
	}
	cd, err := fromUnstructured(obj)
	if err != nil || cd.UID != d.UID {
		return nil, false
	}
	return cd, true
}

// strayEntries lists the domains, other than the joined one, whose status
// still has an entry of this node: a crash or a restart left it.
func (n *Node) strayEntries(joined types.UID) []Domain {
	var out []Domain
	for _, obj := range n.informer.GetStore().List() {
		cd, err := fromUnstructured(obj)
		if err != nil || cd.UID == joined {
			continue
		}
		for _, e := range cd.Status.Nodes {
			if e.Name == n.opts.NodeName {
				out = append(out, Domain{Namespace: cd.Namespace, Name: cd.Name, UID: cd.UID})
			}
		}
	}
	return out
}
