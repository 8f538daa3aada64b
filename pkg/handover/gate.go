package handover

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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
// hand over and that no newer instance takes (Forwarder): the kubelet
// retries it.
var ErrStopping = errors.New("plugin instance is handing over the node and takes no new calls")

// Gate is the kubeletplugin.DRAPlugin an instance serves from its start:
// calls wait (bounded by their context, the kubelet's call timeout) until
// Open hands in the real plugin, i.e. until the instance owns the node;
// after Drain they are forwarded to the newer instance of the node
// (ForwardTo) or, when there is none, refused, and Drain returns once the
// calls in flight have returned. Calls are counted from the moment they
// reach the gRPC server (Interceptor): the helper does API work (the
// claims' GET) before it calls the plugin, and stopping the server then
// would cut the call. Forwarded calls are not in flight for Drain: they
// wait at the newer instance until this one let go of the node; Close
// waits for them.
type Gate struct {
	fatal context.CancelCauseFunc

	mu       sync.Mutex
	plugin   kubeletplugin.DRAPlugin
	holder   Owner // who this instance waits for, named in errors
	draining bool
	inflight sync.WaitGroup
	forward  Forwarder      // nil: refuse what comes after Drain
	closed   bool           // Close began: forward no more
	relayed  sync.WaitGroup // the forwarded calls
	returned time.Time      // when the last call returned
	open     chan struct{}  // closed by Open
	stopping chan struct{}  // closed by Drain
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

// ForwardTo makes the gate forward the calls that come after Drain to f.
// Call it before the gate serves.
func (g *Gate) ForwardTo(f Forwarder) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.forward = f
}

// Open lets calls through to p. Call it once.
func (g *Gate) Open(p kubeletplugin.DRAPlugin) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.plugin = p
	close(g.open)
}

// Drain forwards or refuses new calls, releases the waiting ones with
// ErrStopping (when the gate never opened) and waits for the calls in
// flight (those Interceptor counted) to return: afterwards the plugin is no
// longer called. It may be called more than once.
func (g *Gate) Drain() {
	g.mu.Lock()
	if !g.draining {
		g.draining = true
		close(g.stopping)
	}
	g.mu.Unlock()
	g.inflight.Wait()
}

// flushGrace is how long Close lets the answers of the last calls leave:
// gRPC writes an answer after its handler returned, and the helper stops
// its server abruptly (grpc.Server.Stop), which would cut an answer not
// yet written (the kubelet sees EOF, a failed prepare).
const flushGrace = 200 * time.Millisecond

// Close drains, stops forwarding (later calls are refused) and waits for
// the forwarded calls to return, and for their answers to leave. Call it
// once the instance let go of the node (released the hand-over lock),
// before its gRPC server stops: the newer instance holds forwarded calls
// until it owns the node, and their answers go back through this server.
// The calls' contexts (the kubelet's timeout) bound the wait.
func (g *Gate) Close() {
	g.Drain()
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.relayed.Wait()
	g.mu.Lock()
	flushed := g.returned.Add(flushGrace)
	g.mu.Unlock()
	time.Sleep(time.Until(flushed))
}

// done records that a call returned.
func (g *Gate) done() {
	g.mu.Lock()
	g.returned = time.Now()
	g.mu.Unlock()
}

func (g *Gate) isOpen() bool {
	select {
	case <-g.open:
		return true
	default:
		return false
	}
}

// Interceptor counts the gRPC calls in flight for Drain and, once it
// began, forwards new ones to the newer instance or refuses them. Install
// it on the helper (kubeletplugin.GRPCInterceptor).
func (g *Gate) Interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		g.mu.Lock()
		if g.draining {
			return g.relay(ctx, req, info) // unlocks
		}
		g.inflight.Add(1)
		g.mu.Unlock()
		defer g.inflight.Done()
		defer g.done()
		return handler(context.WithValue(ctx, countedKey{}, true), req)
	}
}

// countedKey marks the context of a call Interceptor counted in flight:
// Drain waits for it, so it reaches the plugin also once Drain began.
type countedKey struct{}

// relay forwards a call that came after Drain, or refuses it. g.mu is held
// and released.
func (g *Gate) relay(ctx context.Context, req any, info *grpc.UnaryServerInfo) (any, error) {
	method := ""
	if info != nil {
		method = info.FullMethod
	}
	logger := klog.FromContext(ctx)
	forward := g.forward
	if forward == nil || g.closed {
		g.mu.Unlock()
		logger.Info("Refused a call: this instance is handing the node over", "method", method)
		return nil, status.Error(codes.Unavailable, ErrStopping.Error())
	}
	g.relayed.Add(1)
	g.mu.Unlock()
	defer g.relayed.Done()
	defer g.done()
	resp, err := forward.Forward(ctx, method, req)
	if errors.Is(err, ErrNoPeer) {
		logger.Info("Refused a call: this instance is handing the node over and no newer one serves", "method", method, "reason", err)
		return nil, status.Error(codes.Unavailable, ErrStopping.Error())
	}
	logger.V(2).Info("Forwarded a call to the newer instance: this one is handing the node over", "method", method, "err", err)
	return resp, err
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
	if g.draining && (g.plugin == nil || ctx.Value(countedKey{}) == nil) {
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
