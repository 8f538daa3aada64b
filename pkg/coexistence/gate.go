package coexistence

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
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
// no device plugin advertises GPUs on the node. Until the Node was read once
// it publishes nothing.
type Gate struct {
	opts Options

	mu        sync.Mutex
	checked   bool
	conflicts []string // sorted "name=quantity"; empty: none
	withdrawn bool     // the empty publication of the conflict went through
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
	if !g.checked || len(g.conflicts) > 0 {
		return nil
	}
	return g.opts.Target.PublishResources(ctx, resources)
}

// Conflicts are the device plugin resources seen at the last read of the
// Node, as name=quantity; empty when there are none.
func (g *Gate) Conflicts() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.conflicts)
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
	conflicts := Conflicts(node)
	g.mu.Lock()
	defer g.mu.Unlock()
	changed := !g.checked || !slices.Equal(conflicts, g.conflicts)
	wasConflict := g.checked && len(g.conflicts) > 0
	g.checked, g.conflicts = true, conflicts
	switch {
	case len(conflicts) > 0:
		if changed {
			g.withdrawn = false
			msg := fmt.Sprintf("A device plugin advertises %s on this node: %s publishes no devices here, so that two drivers never hand out the same GPUs. "+
				"Remove the device plugin from the node, or take %s off it (its node label), as docs/migration.md describes.",
				strings.Join(conflicts, ", "), g.opts.DriverName, g.opts.DriverName)
			logger.Error(nil, "Device plugin on this node; not publishing devices", "node", g.opts.NodeName, "resources", conflicts,
				"fix", "remove the device plugin from the node or this driver's node label (docs/migration.md)")
			g.event(ctx, node, corev1.EventTypeWarning, ReasonConflict, msg)
		}
		if !g.withdrawn {
			if err := g.opts.Target.PublishResources(ctx, resourceslice.DriverResources{}); err != nil {
				logger.Error(err, "Withdrawing ResourceSlices failed; will retry")
				return
			}
			g.withdrawn = true
		}
	case changed:
		if wasConflict {
			logger.Info("Device plugin gone from this node; publishing devices", "node", g.opts.NodeName)
			g.event(ctx, node, corev1.EventTypeNormal, ReasonResolved,
				fmt.Sprintf("No device plugin advertises GPUs on this node any more: %s publishes its devices.", g.opts.DriverName))
		}
		if g.latest != nil {
			if err := g.opts.Target.PublishResources(ctx, *g.latest); err != nil {
				logger.Error(err, "Publish ResourceSlices")
			}
		}
	}
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
		Source:              corev1.EventSource{Component: "dra-kubelet-plugin/" + g.opts.DriverName, Host: node.Name},
		ReportingController: g.opts.DriverName + "/kubelet-plugin",
		ReportingInstance:   node.Name,
	}
	if _, err := g.opts.Client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{}); err != nil && ctx.Err() == nil {
		klog.FromContext(ctx).Error(err, "Recording event on the Node failed", "reason", reason)
	}
}
