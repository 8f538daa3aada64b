package deviceplugin

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// kubelet is the kubelet's registration service, recording requests.
type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (k *kubelet) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.got <- req
	return &pluginapi.Empty{}, nil
}

// The stand-in registers its resource over kubelet.sock the way the kubelet
// expects, and the kubelet then gets its devices from the endpoint it named,
// until Stop ends the stream.
func TestRegisterAndListAndWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{got: make(chan *pluginapi.RegisterRequest, 1)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	p, err := Start(ctx, Options{Dir: dir, ResourceName: "nvidia.com/gpu", Devices: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	req := <-k.got
	if req.ResourceName != "nvidia.com/gpu" || req.Version != pluginapi.Version || req.Endpoint == "" {
		t.Fatalf("Register(%+v), want nvidia.com/gpu, %s and an endpoint", req, pluginapi.Version)
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Devices) != 3 || resp.Devices[0].Health != pluginapi.Healthy {
		t.Fatalf("ListAndWatch sent %v, want 3 healthy devices", resp.Devices)
	}
	p.Stop()
	if _, err := stream.Recv(); err == nil {
		t.Fatal("the stream still sends after Stop")
	}
}

func TestStartRefusesNoDevices(t *testing.T) {
	if _, err := Start(context.Background(), Options{Dir: t.TempDir(), ResourceName: "nvidia.com/gpu"}); err == nil {
		t.Fatal("Start with no devices succeeded")
	}
}
