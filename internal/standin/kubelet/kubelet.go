// Package kubelet plays the kubelet's side of a DRA kubelet plugin
// over its real unix sockets: plugin registration (GetInfo,
// NotifyRegistrationStatus) and the DRA v1 gRPC service. Tests and
// benchmarks use it to drive the plugin exactly as the kubelet would.
package kubelet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	resourceapi "k8s.io/api/resource/v1"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Kubelet is connected to one registered plugin.
type Kubelet struct {
	Info *registerapi.PluginInfo
	conn *grpc.ClientConn
	dra  drapb.DRAPluginClient
}

// Register waits for the plugin's registration socket in registrarDir,
// performs the kubelet's registration handshake and connects to the DRA
// endpoint the plugin announces.
func Register(ctx context.Context, registrarDir string, timeout time.Duration) (*Kubelet, error) {
	return retry(ctx, timeout, func() (*Kubelet, error) { return register(ctx, registrarDir) })
}

// RegisterSocket is Register with one plugin instance's registration
// socket, for a directory where two instances serve (a rolling update).
func RegisterSocket(ctx context.Context, socket string, timeout time.Duration) (*Kubelet, error) {
	return retry(ctx, timeout, func() (*Kubelet, error) { return registerAt(ctx, socket) })
}

func retry(ctx context.Context, timeout time.Duration, register func() (*Kubelet, error)) (*Kubelet, error) {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for time.Now().Before(deadline) {
		k, err := register()
		if err == nil {
			return k, nil
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil, fmt.Errorf("plugin did not register within %v: %w", timeout, lastErr)
}

func register(ctx context.Context, registrarDir string) (*Kubelet, error) {
	entries, err := os.ReadDir(registrarDir)
	if err != nil {
		return nil, err
	}
	var socket string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sock") {
			socket = filepath.Join(registrarDir, e.Name())
		}
	}
	if socket == "" {
		return nil, fmt.Errorf("no registration socket in %s", registrarDir)
	}
	return registerAt(ctx, socket)
}

func registerAt(ctx context.Context, socket string) (*Kubelet, error) {
	regConn, err := dial(socket)
	if err != nil {
		return nil, err
	}
	defer func() { _ = regConn.Close() }()
	reg := registerapi.NewRegistrationClient(regConn)
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("GetInfo: %w", err)
	}
	if info.Type != registerapi.DRAPlugin {
		return nil, fmt.Errorf("plugin type %q, want %q", info.Type, registerapi.DRAPlugin)
	}
	if !slices.Contains(info.SupportedVersions, drapb.DRAPluginService) {
		return nil, fmt.Errorf("plugin supports %v, not %s", info.SupportedVersions, drapb.DRAPluginService)
	}
	conn, err := dial(info.Endpoint)
	if err != nil {
		return nil, err
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	return &Kubelet{Info: info, conn: conn, dra: drapb.NewDRAPluginClient(conn)}, nil
}

func dial(socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// Close drops the connection.
func (k *Kubelet) Close() error { return k.conn.Close() }

// Prepare calls NodePrepareResources for the claims and returns the
// per-claim responses keyed by UID.
func (k *Kubelet) Prepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (map[string]*drapb.NodePrepareResourceResponse, error) {
	resp, err := k.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: pbClaims(claims)})
	if err != nil {
		return nil, err
	}
	return resp.Claims, nil
}

// Unprepare calls NodeUnprepareResources for the claims.
func (k *Kubelet) Unprepare(ctx context.Context, claims ...*resourceapi.ResourceClaim) (map[string]*drapb.NodeUnprepareResourceResponse, error) {
	resp, err := k.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: pbClaims(claims)})
	if err != nil {
		return nil, err
	}
	return resp.Claims, nil
}

// PrepareOne prepares one claim and returns its CDI device IDs, failing on
// any per-claim error.
func (k *Kubelet) PrepareOne(ctx context.Context, claim *resourceapi.ResourceClaim) ([]string, error) {
	resp, err := k.Prepare(ctx, claim)
	if err != nil {
		return nil, err
	}
	r, ok := resp[string(claim.UID)]
	if !ok {
		return nil, fmt.Errorf("no response for claim %s", claim.UID)
	}
	if r.Error != "" {
		return nil, fmt.Errorf("prepare %s: %s", claim.Name, r.Error)
	}
	var ids []string
	for _, d := range r.Devices {
		ids = append(ids, d.CdiDeviceIds...)
	}
	return ids, nil
}

// UnprepareOne unprepares one claim, failing on any per-claim error.
func (k *Kubelet) UnprepareOne(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	resp, err := k.Unprepare(ctx, claim)
	if err != nil {
		return err
	}
	if r := resp[string(claim.UID)]; r == nil {
		return fmt.Errorf("no response for claim %s", claim.UID)
	} else if r.Error != "" {
		return fmt.Errorf("unprepare %s: %s", claim.Name, r.Error)
	}
	return nil
}

func pbClaims(claims []*resourceapi.ResourceClaim) []*drapb.Claim {
	out := make([]*drapb.Claim, 0, len(claims))
	for _, c := range claims {
		out = append(out, &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	return out
}

// WatchHealth opens the plugin's device health stream, as the kubelet does,
// and forwards its messages until ctx ends.
func (k *Kubelet) WatchHealth(ctx context.Context) (<-chan *drahealthv1.NodeWatchResourcesResponse, error) {
	stream, err := drahealthv1.NewDRAResourceHealthClient(k.conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		return nil, err
	}
	out := make(chan *drahealthv1.NodeWatchResourcesResponse, 16)
	go func() {
		defer close(out)
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			select {
			case out <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
