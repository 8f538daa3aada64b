// Package deviceplugin is a minimal device plugin for tests, standing in
// for NVIDIA's: it serves the kubelet's device-plugin API (v1beta1) on a
// socket in the kubelet's device-plugins directory, registers one resource
// name with the kubelet and advertises a number of healthy devices.
// Allocate hands out nothing: it only has to make the kubelet report the
// resource in the Node's capacity and allocatable, as a real one does.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Options configure Start.
type Options struct {
	// Dir is the kubelet's device-plugin directory, holding kubelet.sock;
	// default pluginapi.DevicePluginPath (the kubelet uses that path
	// whatever its --root-dir).
	Dir string
	// ResourceName is the extended resource advertised, e.g. nvidia.com/gpu.
	ResourceName string
	// Devices is how many healthy devices are advertised.
	Devices int
}

// Plugin is a running stand-in device plugin.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	opts    Options
	socket  string
	server  *grpc.Server
	stopped chan struct{}
	once    sync.Once
}

// Start serves the device-plugin API and registers with the kubelet.
func Start(ctx context.Context, opts Options) (*Plugin, error) {
	if opts.Dir == "" {
		opts.Dir = pluginapi.DevicePluginPath
	}
	if opts.ResourceName == "" || opts.Devices < 1 {
		return nil, fmt.Errorf("stand-in device plugin: want a resource name and at least one device, got %q and %d", opts.ResourceName, opts.Devices)
	}
	endpoint := "standin-" + strings.NewReplacer("/", "-", ".", "-").Replace(opts.ResourceName) + ".sock"
	p := &Plugin{opts: opts, socket: filepath.Join(opts.Dir, endpoint), server: grpc.NewServer(), stopped: make(chan struct{})}
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", p.socket, err)
	}
	lis, err := net.Listen("unix", p.socket)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", p.socket, err)
	}
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go func() { _ = p.server.Serve(lis) }()

	conn, err := grpc.NewClient("unix://"+filepath.Join(opts.Dir, filepath.Base(pluginapi.KubeletSocket)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.Stop()
		return nil, fmt.Errorf("connect to the kubelet in %s: %w", opts.Dir, err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: opts.ResourceName,
		Options: &pluginapi.DevicePluginOptions{},
	}); err != nil {
		p.Stop()
		return nil, fmt.Errorf("register %s with the kubelet: %w", opts.ResourceName, err)
	}
	return p, nil
}

// Stop ends the server and removes its socket; the kubelet then marks the
// devices unhealthy (allocatable 0) and drops the resource after its grace
// period.
func (p *Plugin) Stop() {
	p.once.Do(func() {
		close(p.stopped)
		p.server.Stop()
		_ = os.Remove(p.socket)
	})
}

// GetDevicePluginOptions asks for nothing optional.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices once and keeps the stream open.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for i := range p.opts.Devices {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: fmt.Sprintf("standin-%d", i), Health: pluginapi.Healthy})
	}
	if err := stream.Send(resp); err != nil {
		return err
	}
	select {
	case <-stream.Context().Done():
	case <-p.stopped:
	}
	return nil
}

// Allocate gives each container nothing (no devices, mounts or env).
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}
