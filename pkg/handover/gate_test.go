package handover

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// plugin records calls; a prepare blocks until release is closed.
type plugin struct {
	calls   chan string
	release chan struct{}
}

func newPlugin() *plugin { return &plugin{calls: make(chan string, 10), release: make(chan struct{})} }

func (p *plugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.calls <- "prepare"
	<-p.release
	return map[types.UID]kubeletplugin.PrepareResult{}, nil
}

func (p *plugin) UnprepareResourceClaims(context.Context, []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.calls <- "unprepare"
	return map[types.UID]error{}, nil
}

func (p *plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	p.calls <- "health"
	return nil
}

func (p *plugin) HandleError(context.Context, error, string) { p.calls <- "error" }

var claim = &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: "u1"}}

// prepareAsync calls Prepare as the helper's gRPC server does, through
// the gate's interceptor.
func prepareAsync(g *Gate, ctx context.Context) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := g.Interceptor()(ctx, nil, nil, func(ctx context.Context, _ any) (any, error) {
			return g.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
		})
		done <- err
	}()
	return done
}

// Calls wait until the instance owns the node, then reach the plugin.
func TestGateWaitsForOpen(t *testing.T) {
	g, p := NewGate(nil), newPlugin()
	close(p.release)
	done := prepareAsync(g, context.Background())
	select {
	case err := <-done:
		t.Fatalf("prepare returned (%v) before the gate opened", err)
	case <-time.After(500 * time.Millisecond):
	}
	// The probes' empty call is answered while waiting.
	if res, err := g.PrepareResourceClaims(context.Background(), nil); err != nil || len(res) != 0 {
		t.Fatalf("empty prepare while waiting = %v, %v; want an empty answer", res, err)
	}
	g.Open(p)
	if err := waitFor(t, done); err != nil {
		t.Fatalf("prepare after Open: %v", err)
	}
	if c := <-p.calls; c != "prepare" {
		t.Fatalf("plugin got %q, want prepare", c)
	}
}

// A call whose deadline passes while waiting fails naming the holder.
func TestGateDeadlineNamesHolder(t *testing.T) {
	g := NewGate(nil)
	g.WaitingFor(Owner{PodName: "ns/old-pod", PID: 7})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := g.UnprepareResourceClaims(ctx, nil)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ns/old-pod") {
		t.Fatalf("Unprepare = %v, want a deadline error naming the holder", err)
	}
}

// Drain waits for the calls in flight — also one the helper has not
// handed to the plugin yet — refuses new calls and releases waiting ones.
func TestGateDrain(t *testing.T) {
	g, p := NewGate(nil), newPlugin()
	g.Open(p)
	inflight := prepareAsync(g, context.Background())
	<-p.calls // inside the plugin
	drained := make(chan struct{})
	go func() { g.Drain(); close(drained) }()
	select {
	case <-drained:
		t.Fatal("Drain returned while a call was inside the plugin")
	case <-time.After(500 * time.Millisecond):
	}
	// A call still in the helper (its claims' GET) when Drain began: it
	// reaches the plugin, not ErrStopping.
	handlerReached, handlerGo := make(chan struct{}), make(chan struct{})
	early := make(chan error, 1)
	g2, p2 := NewGate(nil), newPlugin()
	close(p2.release)
	g2.Open(p2)
	go func() {
		_, err := g2.Interceptor()(context.Background(), nil, nil, func(ctx context.Context, _ any) (any, error) {
			close(handlerReached)
			<-handlerGo
			return g2.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
		})
		early <- err
	}()
	<-handlerReached
	drained2 := make(chan struct{})
	go func() { g2.Drain(); close(drained2) }()
	select {
	case <-drained2:
		t.Fatal("Drain returned while a call was in the helper")
	case <-time.After(500 * time.Millisecond):
	}
	close(handlerGo)
	if err := waitFor(t, early); err != nil {
		t.Fatalf("call in the helper when Drain began: %v", err)
	}
	if c := <-p2.calls; c != "prepare" {
		t.Fatalf("plugin got %q, want prepare", c)
	}
	<-drained2

	close(p.release)
	if err := waitFor(t, inflight); err != nil {
		t.Fatalf("in-flight prepare: %v", err)
	}
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not return after the call finished")
	}
	if _, err := g.UnprepareResourceClaims(context.Background(), nil); !errors.Is(err, ErrStopping) {
		t.Fatalf("Unprepare after Drain = %v, want ErrStopping", err)
	}
	if err := waitFor(t, prepareAsync(g, context.Background())); status.Code(err) != codes.Unavailable {
		t.Fatalf("a gRPC call after Drain = %v, want Unavailable", err)
	}
	if len(p.calls) != 0 {
		t.Fatalf("plugin called after Drain: %q", <-p.calls)
	}

	// A gate that never opened releases its waiters.
	closed := NewGate(nil)
	waiting := prepareAsync(closed, context.Background())
	select {
	case err := <-waiting:
		t.Fatalf("prepare returned (%v) on a closed gate", err)
	case <-time.After(300 * time.Millisecond): // counted in, waiting
	}
	closed.Drain()
	if err := waitFor(t, waiting); !errors.Is(err, ErrStopping) {
		t.Fatalf("waiting prepare after Drain = %v, want ErrStopping", err)
	}
	if err := closed.WatchHealthStatus(context.Background(), nil); err != nil {
		t.Fatalf("WatchHealthStatus after Drain = %v, want nil", err)
	}
}

// Before the gate opens, a fatal helper error stops the instance; a
// recoverable one does not. After, the plugin handles errors.
func TestGateHandleError(t *testing.T) {
	var fatal error
	g := NewGate(func(err error) { fatal = err })
	g.HandleError(context.Background(), errors.Join(kubeletplugin.ErrRecoverable, errors.New("slow")), "publish")
	if fatal != nil {
		t.Fatalf("recoverable error was fatal: %v", fatal)
	}
	g.HandleError(context.Background(), errors.New("socket gone"), "DRA gRPC server failed")
	if fatal == nil || !strings.Contains(fatal.Error(), "socket gone") {
		t.Fatalf("fatal = %v, want the server's error", fatal)
	}
	p := newPlugin()
	g.Open(p)
	g.HandleError(context.Background(), errors.New("x"), "y")
	if c := <-p.calls; c != "error" {
		t.Fatalf("plugin got %q, want error", c)
	}
}

func waitFor(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("call did not return")
		return nil
	}
}
