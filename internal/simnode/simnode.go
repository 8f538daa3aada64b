// Package simnode runs the production discovery over a simulated machine for
// tests: the same NVML calls, sysfs lookups and device model as a real node.
package simnode

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// Node is a simulated node after discovery.
type Node struct {
	Name      string
	Machine   *nvmlsim.Machine
	GPUs      []discovery.GPU
	Resources resourceslice.DriverResources
}

// New simulates machine as node name and discovers it; the sysfs tree lives
// in a test temp dir.
func New(t testing.TB, machine, name string, opts ...nvmlsim.Option) *Node {
	t.Helper()
	m, err := nvmlsim.New(machine, append([]nvmlsim.Option{nvmlsim.WithSeed(name)}, opts...)...)
	if err != nil {
		t.Fatalf("simulate %s: %v", machine, err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatalf("init simulated NVML: %v", ret)
	}
	t.Cleanup(func() { m.Shutdown() })
	sysfs, err := sharedSysfs(m, machine)
	if err != nil {
		t.Fatalf("write sysfs: %v", err)
	}
	gpus, err := discovery.Discover(context.Background(), m, discovery.Options{SysfsRoot: sysfs})
	if err != nil {
		t.Fatalf("discover %s: %v", machine, err)
	}
	return &Node{
		Name: name, Machine: m, GPUs: gpus,
		Resources: devicemodel.Build(gpus, devicemodel.Options{NodeName: name}),
	}
}

// Rediscover runs discovery again, after a test changed the machine.
func Rediscover(t testing.TB, n *Node) *Node {
	t.Helper()
	sysfs, err := sharedSysfs(n.Machine, n.Machine.Name())
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := discovery.Discover(context.Background(), n.Machine, discovery.Options{SysfsRoot: sysfs})
	if err != nil {
		t.Fatalf("discover: %v", err)
	}
	return &Node{Name: n.Name, Machine: n.Machine, GPUs: gpus,
		Resources: devicemodel.Build(gpus, devicemodel.Options{NodeName: n.Name})}
}

// A machine's sysfs tree depends only on the machine, and creating its
// thousand-odd files costs most of a second on ext4, so a test process
// writes each tree once; Main removes them.
var (
	sysfsMu    sync.Mutex
	sysfsRoot  string
	sysfsTrees = map[string]string{}
)

func sharedSysfs(m *nvmlsim.Machine, machine string) (string, error) {
	sysfsMu.Lock()
	defer sysfsMu.Unlock()
	if dir, ok := sysfsTrees[machine]; ok {
		return dir, nil
	}
	if sysfsRoot == "" {
		dir, err := os.MkdirTemp("", "simnode-sysfs-")
		if err != nil {
			return "", err
		}
		sysfsRoot = dir
	}
	dir := filepath.Join(sysfsRoot, machine)
	if err := m.WriteSysfs(dir); err != nil {
		return "", err
	}
	sysfsTrees[machine] = dir
	return dir, nil
}

// Main runs a test package's tests and removes the shared sysfs trees;
// call it from TestMain.
func Main(m *testing.M) int {
	code := m.Run()
	sysfsMu.Lock()
	defer sysfsMu.Unlock()
	if sysfsRoot != "" {
		_ = os.RemoveAll(sysfsRoot)
	}
	return code
}

// Slices are the ResourceSlices the node publishes for driverName.
func (n *Node) Slices(driverName string) []*resourceapi.ResourceSlice {
	return devicemodel.ResourceSlices(n.Resources, driverName, n.Name)
}

// WithStaticMIG creates a MIG instance out of band (as an administrator
// would) on GPU index gpu with the GPU instance profile and placement, and
// returns the node discovered anew with it.
func WithStaticMIG(t testing.TB, n *Node, gpu int, giProfile uint32, pl mig.Placement) (*Node, *mig.Instance) {
	t.Helper()
	dev, ret := n.Machine.DeviceGetHandleByIndex(gpu)
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU %d: %v", gpu, ret)
	}
	inst, err := mig.Create(context.Background(), dev, giProfile, pl)
	if err != nil {
		t.Fatalf("create MIG instance on GPU %d: %v", gpu, err)
	}
	return Rediscover(t, n), inst
}
