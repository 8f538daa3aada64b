package handover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
)

// Forwarder sends a call that reaches a draining instance to the newer
// instance of the node. The kubelet sends a call to the newest registration
// of a driver that is connected: right after the new instance registered,
// that may still be the old one, even while it drains.
type Forwarder interface {
	// Forward sends the unary gRPC call method with req to another
	// instance and returns its answer; an error wrapping ErrNoPeer when
	// no other instance can take it.
	Forward(ctx context.Context, method string, req any) (any, error)
}

// ErrNoPeer says that no other instance of the node takes the call.
var ErrNoPeer = errors.New("no newer plugin instance serves the node")

// forwarded are the DRA calls an instance forwards, by gRPC method, with
// the type of their answer; the helper serves v1 and v1beta1.
var forwarded = map[string]func() any{
	drapbv1.DRAPlugin_NodePrepareResources_FullMethodName:        func() any { return new(drapbv1.NodePrepareResourcesResponse) },
	drapbv1.DRAPlugin_NodeUnprepareResources_FullMethodName:      func() any { return new(drapbv1.NodeUnprepareResourcesResponse) },
	drapbv1beta1.DRAPlugin_NodePrepareResources_FullMethodName:   func() any { return new(drapbv1beta1.NodePrepareResourcesResponse) },
	drapbv1beta1.DRAPlugin_NodeUnprepareResources_FullMethodName: func() any { return new(drapbv1beta1.NodeUnprepareResourcesResponse) },
}

// dialTimeout bounds the check that a peer's socket accepts connections.
const dialTimeout = 2 * time.Second

// SocketForwarder forwards to the other instances' DRA sockets in the
// plugin data directory (dra-<pod UID>.sock, kubeletplugin.RollingUpdate):
// to the newest socket that accepts a connection, which in a rolling update
// (maxSurge 1) is the instance that waits for the hand-over lock; its gate
// holds the call until it owns the node.
type SocketForwarder struct {
	Dir string // the plugin data directory
	Own string // this instance's socket file name in Dir, never a peer
}

var _ Forwarder = (*SocketForwarder)(nil)

// Forward implements Forwarder.
func (f *SocketForwarder) Forward(ctx context.Context, method string, req any) (any, error) {
	answer, ok := forwarded[method]
	if !ok {
		return nil, fmt.Errorf("%w: %s is not forwarded", ErrNoPeer, method)
	}
	peer, err := f.peer(ctx)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("unix://"+peer, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to the plugin instance at %s: %w", peer, err)
	}
	defer func() { _ = conn.Close() }()
	resp := answer()
	if err := conn.Invoke(ctx, method, req, resp); err != nil {
		return nil, err // the peer's gRPC status, as the kubelet would get it from there
	}
	return resp, nil
}

// peer returns the path of the newest other DRA socket in Dir that accepts
// a connection.
func (f *SocketForwarder) peer(ctx context.Context) (string, error) {
	paths, err := filepath.Glob(filepath.Join(f.Dir, "dra*.sock"))
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoPeer, err)
	}
	type socket struct {
		path  string
		mtime time.Time
	}
	var sockets []socket
	for _, path := range paths {
		if filepath.Base(path) == f.Own {
			continue
		}
		if st, err := os.Stat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			sockets = append(sockets, socket{path, st.ModTime()})
		}
	}
	slices.SortFunc(sockets, func(a, b socket) int { return b.mtime.Compare(a.mtime) })
	var dialer net.Dialer
	for _, s := range sockets {
		dialCtx, cancel := context.WithTimeout(ctx, dialTimeout)
		conn, err := dialer.DialContext(dialCtx, "unix", s.path)
		cancel()
		if err == nil {
			_ = conn.Close()
			return s.path, nil
		}
	}
	return "", fmt.Errorf("%w: no other DRA socket in %s accepts connections", ErrNoPeer, f.Dir)
}
