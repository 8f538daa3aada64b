package handover

import (
	"context"
	"errors"
	"fmt"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// ErrStopping answers a call that reaches an instance after it began to
// hand over: the kubelet retries it, on the newer instance.
var ErrStopping = errors.New("plugin instance is handing over the node and takes no new calls")

// Gate is the kubeletplugin.DRAPlugin an instance serves from its start:
// calls wait (bounded by their context, the kubelet's call timeout) until
// Open hands in the real plugin, i.e. until the instance owns the node;
// after Drain they are refused, and Drain returns once the calls inside
// the plugin have returned.
type Gate struct {
	fatal context.CancelCauseFunc

	mu       sync.Mutex
	plugin   kubeletplugin.DRAPlugin
	holder   Owner // who this instance waits for, named in errors
	draining bool
	inflight sync.WaitGroup
	open     chan struct{} // closed by Open
	stopping chan struct{} // closed by Drain
}

var _ kubeletplugin.DRAPlugin = (*Gate)(nil)

// NewGate returns a closed gate; fatal (may be nil) stops the instance on
// a fatal background error the helper reports before the gate opens.
func NewGate(fatal context.CancelCauseFunc) *Gate {
	return &Gate{fatal: fatal, open: make(chan struct{}), stopping: make(chan struct{})}
}

// WaitingFor records the instance this one waits for (Acquire's waiting).
func (g *Gate) WaitingFor(holder Owner) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holder = holder
}

// Open lets calls through to p. Call it once.
func (g *Gate) Open(p kubeletplugin.DRAPlugin) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.plugin = p
	close(g.open)
}

// Drain refuses new calls, releases the waiting ones with ErrStopping and
// waits for the calls inside the plugin to return: afterwards the plugin
// is no longer called. It may be called more than once.
func (g *Gate) Drain() {
	g.mu.Lock()
	if !g.draining {
		g.draining = true
		close(g.stopping)
	}
	g.mu.Unlock()
	g.inflight.Wait()
}

func (g *Gate) isOpen() bool {
	select {
	case <-g.open:
		return true
	default:
		return false
	}
}

// enter waits until the gate is open and counts the caller in; done must
// be called when the call returns from the plugin.
func (g *Gate) enter(ctx context.Context) (p kubeletplugin.DRAPlugin, done func(), err error) {
	select {
	case <-g.open:
	case <-g.stopping:
	case <-ctx.Done():
		g.mu.Lock()
		holder := g.holder
		g.mu.Unlock()
		return nil, nil, fmt.Errorf("wait for the node's hand-over from %s: %w", holder, context.Cause(ctx))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining {
		return nil, nil, ErrStopping
	}
	g.inflight.Add(1)
	return g.plugin, g.inflight.Done, nil
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
// A call without claims (the probes') is answered at once while the
// instance waits: readiness must not wait for the hand-over, or the
// DaemonSet would never delete the old pod.
func (g *Gate) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	if len(claims) == 0 && !g.isOpen() {
		return map[types.UID]kubeletplugin.PrepareResult{}, nil
	}
	p, done, err := g.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return p.PrepareResourceClaims(ctx, claims)
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (g *Gate) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p, done, err := g.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return p.UnprepareResourceClaims(ctx, claims)
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: the stream starts
// once the instance owns the node; until then the kubelet sees no reports.
// It is not counted as a call in flight: it only reads, and lasts.
func (g *Gate) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	select {
	case <-g.open:
		return g.plugin.WatchHealthStatus(ctx, reports)
	case <-g.stopping:
		return nil
	case <-ctx.Done():
		return nil
	}
}

// HandleError implements kubeletplugin.DRAPlugin.
func (g *Gate) HandleError(ctx context.Context, err error, msg string) {
	g.mu.Lock()
	p := g.plugin
	g.mu.Unlock()
	if p != nil {
		p.HandleError(ctx, err, msg)
		return
	}
	utilruntime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) && g.fatal != nil {
		g.fatal(fmt.Errorf("%s: %w", msg, err))
	}
}
