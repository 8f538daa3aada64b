package handover

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"

	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
)

// instancePlugin answers every claim with one device of a pool named
// after the instance, so that a test sees which instance prepared it.
type instancePlugin struct {
	name     string
	prepares chan struct{}
}

func (p *instancePlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	res := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		p.prepares <- struct{}{}
		res[c.UID] = kubeletplugin.PrepareResult{Devices: []kubeletplugin.Device{{PoolName: p.name, DeviceName: "gpu-0"}}}
	}
	return res, nil
}

func (p *instancePlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	res := map[types.UID]error{}
	for _, c := range claims {
		res[c.UID] = nil
	}
	return res, nil
}

func (p *instancePlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return nil
}

func (p *instancePlugin) HandleError(context.Context, error, string) {}

// allocated is claim as the kubelet prepares it: allocated.
var allocated = func() *resourceapi.ResourceClaim {
	c := claim.DeepCopy()
	c.Status.Allocation = &resourceapi.AllocationResult{}
	return c
}()

// serveInstance serves g on dir/socket through the kubelet helper, as
// pkg/nodeplugin does in a rolling update, forwarding to the other
// sockets in dir once g drains.
func serveInstance(t *testing.T, ctx context.Context, dir, socket string, g *Gate, client kubernetes.Interface) *kubeletplugin.Helper {
	t.Helper()
	g.ForwardTo(&SocketForwarder{Dir: dir, Own: socket})
	h, err := kubeletplugin.Start(ctx, g,
		kubeletplugin.KubeClient(client), kubeletplugin.NodeName("node"), kubeletplugin.DriverName("gpu.dra.dev"),
		kubeletplugin.PluginDataDirectoryPath(dir), kubeletplugin.PluginSocket(socket),
		kubeletplugin.RegistrationService(false), kubeletplugin.Serialize(false),
		kubeletplugin.GRPCInterceptor(g.Interceptor()))
	if err != nil {
		t.Fatalf("start the instance on %s: %v", socket, err)
	}
	t.Cleanup(h.Stop)
	return h
}

// kubeletCall sends NodePrepareResources for claim to dir/socket as the
// kubelet does, in API version v1 or v1beta1, and returns the pool of the
// device it got.
func kubeletCall(ctx context.Context, path, version string) (string, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer func() { _ = conn.Close() }()
	uid := string(claim.UID)
	if version == "v1beta1" {
		resp, err := drapbv1beta1.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapbv1beta1.NodePrepareResourcesRequest{
			Claims: []*drapbv1beta1.Claim{{Namespace: claim.Namespace, Name: claim.Name, Uid: uid}}})
		if err != nil {
			return "", err
		}
		return pool(resp.GetClaims()[uid].GetError(), resp.GetClaims()[uid].GetDevices())
	}
	resp, err := drapbv1.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{
		Claims: []*drapbv1.Claim{{Namespace: claim.Namespace, Name: claim.Name, Uid: uid}}})
	if err != nil {
		return "", err
	}
	return pool(resp.GetClaims()[uid].GetError(), resp.GetClaims()[uid].GetDevices())
}

func pool[D interface{ GetPoolName() string }](claimErr string, devices []D) (string, error) {
	if claimErr != "" {
		return "", status.Error(codes.Unknown, claimErr)
	}
	if len(devices) != 1 {
		return "", status.Errorf(codes.Internal, "got %d devices, want 1", len(devices))
	}
	return devices[0].GetPoolName(), nil
}

// A prepare that reaches a draining instance (the kubelet's connection to
// the newer one is not up yet) is forwarded to the newer instance, whose
// gate holds it until that instance owns the node; the old instance's
// Close waits for it. Without a newer instance the call is refused.
func TestDrainingGateForwardsToNewerInstance(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := tempDir(t)
	oldPlugin := &instancePlugin{name: "old", prepares: make(chan struct{}, 10)}
	newPlugin := &instancePlugin{name: "new", prepares: make(chan struct{}, 10)}
	oldGate, newGate := NewGate(nil), NewGate(nil)
	oldGate.Open(oldPlugin)
	oldHelper := serveInstance(t, ctx, dir, "dra-old.sock", oldGate, fake.NewClientset(allocated))
	// The new instance's helper gets the claim before its gate holds the call.
	newClient, reached := fake.NewClientset(allocated), make(chan struct{}, 10)
	newClient.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		reached <- struct{}{}
		return false, nil, nil
	})
	serveInstance(t, ctx, dir, "dra-new.sock", newGate, newClient)
	oldSocket := filepath.Join(dir, "dra-old.sock")

	if got, err := kubeletCall(ctx, oldSocket, "v1"); err != nil || got != "old" {
		t.Fatalf("prepare on the owner = %q, %v; want its own answer", got, err)
	}
	oldGate.Drain()
	answered := make(chan error, 1)
	go func() {
		got, err := kubeletCall(ctx, oldSocket, "v1")
		if err == nil && got != "new" {
			err = status.Errorf(codes.Internal, "prepared by the %s instance, want the new one", got)
		}
		answered <- err
	}()
	select {
	case <-reached:
	case err := <-answered:
		t.Fatalf("the prepare sent to the draining instance returned (%v) without reaching the new one", err)
	}
	closed := make(chan struct{})
	go func() { oldGate.Close(); close(closed) }()
	select {
	case err := <-answered:
		t.Fatalf("the forwarded prepare returned (%v) before the new instance owned the node", err)
	case <-closed:
		t.Fatal("Close returned while a forwarded call waited at the new instance")
	case <-time.After(500 * time.Millisecond):
	}
	newGate.Open(newPlugin)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return after the forwarded call")
	}
	// The instance stops its server (abruptly) once Close returned: the
	// answer has left by then.
	oldHelper.Stop()
	if err := waitFor(t, answered); err != nil {
		t.Fatalf("prepare sent to the draining instance: %v", err)
	}
	if len(oldPlugin.prepares) != 1 {
		t.Errorf("the draining instance's plugin prepared %d times, want only the call before Drain", len(oldPlugin.prepares))
	}

	if _, err := oldGate.Interceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: drapbv1.DRAPlugin_NodePrepareResources_FullMethodName},
		func(context.Context, any) (any, error) { return nil, nil }); status.Code(err) != codes.Unavailable {
		t.Errorf("a call after Close = %v, want Unavailable: %v", err, ErrStopping)
	}

	// v1beta1 is forwarded as such, to the newest socket.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "dra-new.sock"), later, later); err != nil {
		t.Fatal(err)
	}
	drained(t, ctx, dir, "dra-b.sock")
	if got, err := kubeletCall(ctx, filepath.Join(dir, "dra-b.sock"), "v1beta1"); err != nil || got != "new" {
		t.Errorf("v1beta1 prepare sent to a draining instance = %q, %v; want the new instance's answer", got, err)
	}
	// Without a newer instance the call is refused.
	lone := tempDir(t)
	drained(t, ctx, lone, "dra-lone.sock")
	testfs.DeadSocket(t, filepath.Join(lone, "dra-dead.sock"))
	if _, err := kubeletCall(ctx, filepath.Join(lone, "dra-lone.sock"), "v1"); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), ErrStopping.Error()) {
		t.Errorf("prepare without a newer instance = %v, want Unavailable: %v", err, ErrStopping)
	}
}

// drained serves a drained, opened gate on dir/socket.
func drained(t *testing.T, ctx context.Context, dir, socket string) {
	t.Helper()
	g := NewGate(nil)
	g.Open(&instancePlugin{name: socket, prepares: make(chan struct{}, 10)})
	serveInstance(t, ctx, dir, socket, g, fake.NewClientset(allocated))
	g.Drain()
}

// tempDir is a temporary directory with a short path, for sockets (108 bytes at most).
func tempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "fwd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
