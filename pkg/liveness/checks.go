package liveness

import (
	"context"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Names of the checks below, for Prober.Passing.
const (
	DRASocketCheck          = "dra-socket"
	RegistrationSocketCheck = "registration-socket"
	NVMLCheck               = "nvml"
	EngineCheck             = "engine"
)

// DefaultStallBound is how long an operation of the prepare engine may be
// in flight before the engine check fails: above the kubelet's 45s call
// timeout (a call that old has failed for the kubelet already) and far
// above a MIG reconfiguration's seconds.
const DefaultStallBound = time.Minute

// DRASocket checks that the DRA gRPC service on the unix socket at path
// answers as the kubelet calls it: a NodePrepareResources without claims,
// which goes through the kubelet helper into the prepare engine and changes
// nothing.
func DRASocket(path string) Check {
	return Check{Name: DRASocketCheck, Run: func(ctx context.Context) error {
		return withConn(path, func(conn *grpc.ClientConn) error {
			if _, err := drapb.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}); err != nil {
				return fmt.Errorf("NodePrepareResources on %s: %w", path, err)
			}
			return nil
		})
	}}
}

// Stalls reports operations of the prepare engine in flight longer than a
// bound (*prepare.Engine); it must not block.
type Stalls interface {
	Stalled(bound time.Duration) error
}

// Engine checks that what serving needs is not wedged: the DRA socket's
// empty call takes none of the engine's locks, so a hung checkpoint save or
// a hung NVML call under a GPU lock would leave DRASocket passing while
// every real prepare hangs. engine returns nil while the instance has none
// (it waits to own the node); the check passes then.
func Engine(engine func() Stalls, bound time.Duration) Check {
	return Check{Name: EngineCheck, Run: func(context.Context) error {
		if e := engine(); e != nil {
			return e.Stalled(bound)
		}
		return nil
	}}
}

// RegistrationSocket checks that the registration service on the unix
// socket at path answers the kubelet's GetInfo.
func RegistrationSocket(path string) Check {
	return Check{Name: RegistrationSocketCheck, Run: func(ctx context.Context) error {
		return withConn(path, func(conn *grpc.ClientConn) error {
			if _, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
				return fmt.Errorf("GetInfo on %s: %w", path, err)
			}
			return nil
		})
	}}
}

// withConn runs f over a new connection to the unix socket at path: each
// round connects afresh, as the kubelet does after a plugin restart.
func withConn(path string, f func(*grpc.ClientConn) error) error {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", path, err)
	}
	defer func() { _ = conn.Close() }()
	return f(conn)
}

// NVML checks that NVML answers a cheap read-only call (DeviceGetCount).
// A hung NVML call does not honor ctx: the Prober's timeout and its single
// outstanding call per check bound it.
func NVML(lib nvml.Interface) Check {
	return Check{Name: NVMLCheck, Run: func(context.Context) error {
		if _, ret := lib.DeviceGetCount(); ret != nvml.SUCCESS {
			return fmt.Errorf("NVML DeviceGetCount: %w", ret)
		}
		return nil
	}}
}
