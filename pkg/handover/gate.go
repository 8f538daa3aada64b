package handover

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// ErrStopping answers a call that reaches an instance after it began to
// hand over: the kubelet retries it, on the newer instance.
var ErrStopping = errors.New("plugin instance is handing over the node and takes no new calls")

// Gate is the kubeletplugin.DRAPlugin an instance serves from its start:
// calls wait (bounded by their context, the kubelet's call timeout) until
// Open hands in the real plugin, i.e. until the instance owns the node;
// after Drain they are refused, and Drain returns once the calls in flight
// have returned. Calls are counted from the moment they reach the gRPC
// server (Interceptor): the helper does API work (the claims' GET) before
// it calls the plugin, and stopping the server then would cut the call.
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
// waits for the calls in flight (those Interceptor counted) to return:
// afterwards the plugin is no longer called. It may be called more than once.
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

// Interceptor counts the gRPC calls in flight for Drain and refuses new
// ones once it began. Install it on the helper (kubeletplugin.GRPCInterceptor).
func (g *Gate) Interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		g.mu.Lock()
		if g.draining {
			g.mu.Unlock()
			method := ""
			if info != nil {
				method = info.FullMethod
			}
			klog.FromContext(ctx).Info("Refused a call: this instance is handing the node over", "method", method)
			return nil, status.Error(codes.Unavailable, ErrStopping.Error())
		}
		g.inflight.Add(1)
		g.mu.Unlock()
		defer g.inflight.Done()
		return handler(ctx, req)
	}
}

// enter waits until the gate is open and returns the plugin to call.
func (g *Gate) enter(ctx context.Context) (kubeletplugin.DRAPlugin, error) {
	select {
	case <-g.open:
	case <-g.stopping:
	case <-ctx.Done():
		g.mu.Lock()
		holder := g.holder
		g.mu.Unlock()
		return nil, fmt.Errorf("wait for the node's hand-over from %s: %w", holder, context.Cause(ctx))
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining {
		return nil, ErrStopping
	}
	return g.plugin, nil
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
// A call without claims (the probes') is answered at once while the
// instance waits: readiness must not wait for the hand-over, or the
// DaemonSet would never delete the old pod.
func (g *Gate) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	if len(claims) == 0 && !g.isOpen() {
		return map[types.UID]kubeletplugin.PrepareResult{}, nil
	}
	p, err := g.enter(ctx)
	if err != nil {
		return nil, err
	}
	return p.PrepareResourceClaims(ctx, claims)
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (g *Gate) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p, err := g.enter(ctx)
	if err != nil {
		return nil, err
	}
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
