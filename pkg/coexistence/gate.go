package coexistence

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Event reasons recorded on the Node.
const (
	// ReasonConflict: a device plugin advertises GPUs; nothing is published.
	ReasonConflict = "DevicePluginConflict"
	// ReasonResolved: the device plugin is gone; the devices are published.
	ReasonResolved = "DevicePluginGone"
	// ReasonDRAConflict: NVIDIA's DRA driver publishes ResourceSlices on the
	// node (and no device plugin advertises GPUs); nothing is published.
	ReasonDRAConflict = "NVIDIADRADriverConflict"
	// ReasonDRAResolved: NVIDIA's DRA driver's slices are gone; the devices
	// are published.
	ReasonDRAResolved = "NVIDIADRADriverGone"
)

// Target publishes ResourceSlices; *kubeletplugin.Helper implements it.
type Target interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// Options configure a Gate.
type Options struct {
	Client     kubernetes.Interface
	NodeName   string
	DriverName string
	Target     Target
	// Period between two reads of the Node.
	Period time.Duration
}

// Gate is a Target that passes publications on to Options.Target only while
// no device plugin advertises GPUs on the node and NVIDIA's DRA driver
// publishes no ResourceSlices there. Until the Node and the slices were read
// once it publishes nothing.
type Gate struct {
	opts Options

	mu        sync.Mutex
	checked   bool
	plugin    []string // sorted "name=quantity"; empty: none
	dra       []string // sorted DRADriverConflicts; empty: none
	withdrawn bool     // the withdrawal of the conflict went through
	passed    bool     // a publication went through to Options.Target
	latest    *resourceslice.DriverResources
}

// New returns a Gate; Run makes it read the Node.
func New(opts Options) *Gate { return &Gate{opts: opts} }

// PublishResources remembers resources and publishes them unless a device
// plugin advertises GPUs on the node (or the Node was not read yet).
func (g *Gate) PublishResources(ctx context.Context, resources resourceslice.DriverResources) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.latest = &resources
	if !g.checked || g.inConflict() {
		return nil
	}
	return g.publish(ctx, resources)
}

// publish passes resources on to Options.Target; g.mu is held.
func (g *Gate) publish(ctx context.Context, resources resourceslice.DriverResources) error {
	g.passed = true
	return g.opts.Target.PublishResources(ctx, resources)
}

func (g *Gate) inConflict() bool { return len(g.plugin)+len(g.dra) > 0 }

// Conflicts are the device plugin resources (name=quantity) and NVIDIA's
// DRA driver's ResourceSlices seen at the last check; empty when there are
// none.
func (g *Gate) Conflicts() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Concat(g.plugin, g.dra)
}

// Run reads the Node every Period until ctx is done.
func (g *Gate) Run(ctx context.Context) {
	for {
		g.check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(g.opts.Period):
		}
	}
}

// Conflicts lists the device plugin resources a node's allocatable has,
// as sorted name=quantity. Allocatable, not capacity: the kubelet keeps a
// stopped device plugin's capacity for five minutes with nothing
// allocatable, and the scheduler hands a name to the device plugin exactly
// while allocatable has it.
func Conflicts(node *corev1.Node) []string {
	var out []string
	for name, q := range node.Status.Allocatable {
		if vocabulary.IsDevicePluginResource(string(name)) && q.Sign() > 0 {
			out = append(out, fmt.Sprintf("%s=%s", name, q.String()))
		}
	}
	slices.Sort(out)
	return out
}

func (g *Gate) check(ctx context.Context) {
	logger := klog.FromContext(ctx)
	// resourceVersion 0: served from the API server's cache, cheap enough
	// for every node every few seconds.
	node, err := g.opts.Client.CoreV1().Nodes().Get(ctx, g.opts.NodeName, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		if ctx.Err() == nil {
			logger.Error(err, "Reading the Node for device plugin resources failed; will retry", "node", g.opts.NodeName)
		}
		return
	}
	nvidia, err := g.nvidiaSlices(ctx)
	if err != nil {
		if ctx.Err() == nil {
			logger.Error(err, "Reading NVIDIA's DRA driver's ResourceSlices failed; will retry")
		}
		return
	}
	plugin, dra := Conflicts(node), DRADriverConflicts(nvidia)
	g.mu.Lock()
	defer g.mu.Unlock()
	changed := !g.checked || !slices.Equal(plugin, g.plugin) || !slices.Equal(dra, g.dra)
	wasConflict, wasPlugin := g.checked && g.inConflict(), len(g.plugin) > 0
	g.checked, g.plugin, g.dra = true, plugin, dra
	switch {
	case g.inConflict():
		if changed {
			g.withdrawn = false
			g.reportConflict(ctx, node)
		}
		if !g.withdrawn {
			if err := g.withdraw(ctx, nvidia); err != nil {
				logger.Error(err, "Withdrawing ResourceSlices failed; will retry")
				return
			}
			g.withdrawn = true
		}
	case changed:
		if wasConflict {
			reason, what := ReasonResolved, "device plugin advertises GPUs"
			if !wasPlugin {
				reason, what = ReasonDRAResolved, "ResourceSlices of NVIDIA's DRA driver are"
			}
			logger.Info("Conflict gone from this node; publishing devices", "node", g.opts.NodeName, "reason", reason)
			g.event(ctx, node, corev1.EventTypeNormal, reason,
				fmt.Sprintf("No %s on this node any more: %s publishes its devices.", what, g.opts.DriverName))
		}
		if g.latest != nil {
			if err := g.publish(ctx, *g.latest); err != nil {
				logger.Error(err, "Publish ResourceSlices")
			}
		}
	}
}

// reportConflict logs the conflict and records it on the Node; g.mu is held.
func (g *Gate) reportConflict(ctx context.Context, node *corev1.Node) {
	var found, remove []string
	reason := ReasonDRAConflict
	if len(g.plugin) > 0 {
		reason = ReasonConflict
		found = append(found, "a device plugin advertises "+strings.Join(g.plugin, ", "))
		remove = append(remove, "the device plugin")
	}
	if len(g.dra) > 0 {
		found = append(found, fmt.Sprintf("NVIDIA's DRA driver (%s) publishes %s", vocabulary.NVIDIADriverName, strings.Join(g.dra, ", ")))
		remove = append(remove, "NVIDIA's DRA driver's kubelet plugin")
	}
	what, fix := strings.Join(found, "; and "), strings.Join(remove, " and ")
	msg := fmt.Sprintf("On this node %s: %s publishes no devices here, so that two drivers never hand out the same GPUs. "+
		"Remove %s from the node, or take %s off it (its node label), as docs/migration.md describes.",
		what, g.opts.DriverName, fix, g.opts.DriverName)
	klog.FromContext(ctx).Error(nil, "Another GPU driver on this node; not publishing devices", "node", g.opts.NodeName,
		"devicePlugin", g.plugin, "nvidiaDRADriver", g.dra,
		"fix", "remove "+fix+" from the node or this driver's node label (docs/migration.md)")
	g.event(ctx, node, corev1.EventTypeWarning, reason, msg)
}

// withdraw takes this plugin's devices off the node; g.mu is held. It
// publishes nothing through Options.Target, whose slice controller owns
// every slice of the driver name on the node, when that name is NVIDIA's,
// NVIDIA's plugin publishes there and nothing went through yet: an empty
// publication would delete NVIDIA's slices too. Then this plugin's own
// slices, left by an earlier run, are deleted directly (deleteOurs). Once
// the controller runs it deletes NVIDIA's slices on its own whatever the
// Gate does, so the two plugins fight over the pool (docs/migration.md).
func (g *Gate) withdraw(ctx context.Context, nvidia []resourceapi.ResourceSlice) error {
	if len(g.dra) > 0 && g.opts.DriverName == vocabulary.NVIDIADriverName && !g.passed {
		return g.deleteOurs(ctx, nvidia)
	}
	return g.publish(ctx, resourceslice.DriverResources{})
}

// event records an event on the Node. Events are only written on changes,
// so no aggregation is needed; a failure is logged, not retried.
func (g *Gate) event(ctx context.Context, node *corev1.Node, typ, reason, msg string) {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: node.Name + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
		},
		Reason: reason, Message: msg, Type: typ, Count: 1,
		FirstTimestamp: now, LastTimestamp: now,
		Source:              corev1.EventSource{Component: vocabulary.KubeletPluginAgent + "/" + g.opts.DriverName, Host: node.Name},
		ReportingController: g.opts.DriverName + "/kubelet-plugin",
		ReportingInstance:   node.Name,
	}
	if _, err := g.opts.Client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
		klog.FromContext(ctx).Error(err, "Recording event on the Node failed", "reason", reason)
	}
}
