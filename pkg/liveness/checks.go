package liveness

import (
	"context"
	"fmt"

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
)

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
