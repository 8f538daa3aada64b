package kubectlgpu_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const driverName = vocabulary.DriverName

func TestMain(m *testing.M) { os.Exit(simnode.Main(m)) }

// fixture is a cluster of simulated nodes whose slices come from the same
// code as `dra-kubelet-plugin --print-slices`, with claims allocated by the
// upstream allocator and pods reserving them.
type fixture struct {
	t       testing.TB
	slices  []*resourceapi.ResourceSlice
	classes []*resourceapi.DeviceClass
	alloc   *at.Cluster
	objects []runtime.Object
	uid     int
	shares  int
}

// newFixture simulates nodes, given as name=machine.
func newFixture(t testing.TB, nodes ...string) *fixture {
	t.Helper()
	f := &fixture{t: t, classes: deviceclass.DeviceClasses(driverName)}
	for _, spec := range nodes {
		name, machine, _ := strings.Cut(spec, "=")
		f.addNode(simnode.New(t, machine, name))
	}
	return f
}

// addNode adds the slices a simulated node publishes.
func (f *fixture) addNode(n *simnode.Node) {
	for i, s := range n.Slices(driverName) {
		s.Name = fmt.Sprintf("%s%c", s.GenerateName, 'a'+i)
		f.slices = append(f.slices, s)
	}
}

// taint taints every device of a node whose name starts with prefix; call
// it before allocating.
func (f *fixture) taint(node, prefix string, taint resourceapi.DeviceTaint) {
	for _, s := range f.slices {
		if *s.Spec.NodeName != node {
			continue
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if d.Name == prefix || strings.HasPrefix(d.Name, prefix+"-") {
				d.Taints = append(d.Taints, taint)
			}
		}
	}
}

func (f *fixture) allocator() *at.Cluster {
	if f.alloc == nil {
		f.alloc = at.NewCluster(f.slices, f.classes)
	}
	return f.alloc
}

// run allocates claim on node and adds it, reserved for a running pod of
// the same name, to the cluster.
func (f *fixture) run(node, namespace string, claim *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	f.t.Helper()
	claim.Namespace = namespace
	allocated := f.allocator().MustAllocate(f.t, node, claim)[0]
	// The allocator draws share IDs at random; number them for stable
	// golden files.
	for i := range allocated.Status.Allocation.Devices.Results {
		if r := &allocated.Status.Allocation.Devices.Results[i]; r.ShareID != nil {
			f.shares++
			id := types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", f.shares))
			r.ShareID = &id
		}
	}
	pod := f.pod(node, namespace, claim.Name, claim.Name)
	pod.Status.Phase = corev1.PodRunning
	allocated.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	f.objects = append(f.objects, allocated, pod)
	return allocated
}

// pending adds an unallocated claim and a pending pod referencing it.
func (f *fixture) pending(namespace string, claim *resourceapi.ResourceClaim) {
	claim.Namespace = namespace
	pod := f.pod("", namespace, claim.Name, claim.Name)
	pod.Status.Phase = corev1.PodPending
	f.objects = append(f.objects, claim, pod)
}

func (f *fixture) pod(node, namespace, name, claim string) *corev1.Pod {
	f.uid++
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, UID: types.UID(fmt.Sprintf("pod-uid-%d", f.uid))},
		Spec: corev1.PodSpec{
			NodeName:       node,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}},
			Containers:     []corev1.Container{{Name: "main", Image: "cuda"}},
		},
	}
}

func (f *fixture) client() *fake.Clientset {
	objs := append([]runtime.Object{}, f.objects...)
	for _, s := range f.slices {
		objs = append(objs, s)
	}
	for _, c := range f.classes {
		objs = append(objs, c)
	}
	return fake.NewClientset(objs...)
}

// command is one of the plugin's commands with its argument.
type command func(ctx context.Context, client kubernetes.Interface, o kubectlgpu.Options) error

func nodes() command { return kubectlgpu.RunNodes }

func node(name string) command {
	return func(ctx context.Context, c kubernetes.Interface, o kubectlgpu.Options) error {
		return kubectlgpu.RunNode(ctx, c, o, name)
	}
}

func claims(namespace string) command {
	return func(ctx context.Context, c kubernetes.Interface, o kubectlgpu.Options) error {
		return kubectlgpu.RunClaims(ctx, c, o, namespace)
	}
}

// kubectlGPU runs a command with an output format (and optionally another
// driver) against client; it returns stdout and stderr.
func kubectlGPU(t testing.TB, client kubernetes.Interface, cmd command, output string, driver ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	o := kubectlgpu.Options{Output: output, Out: &out, ErrOut: &errOut}
	if len(driver) > 0 {
		o.Driver = driver[0]
	}
	err := cmd(context.Background(), client, o)
	return out.String(), errOut.String(), err
}

func mustRun(t testing.TB, client kubernetes.Interface, cmd command, output string) string {
	t.Helper()
	out, errOut, err := kubectlGPU(t, client, cmd, output)
	if err != nil {
		t.Fatalf("kubectl gpu: %v\nstderr: %s", err, errOut)
	}
	return out
}

// Requests pinned to one GPU by minor, one per way of using it.
func onGPU(minor int, kind string, extra ...string) resourceapi.DeviceRequest {
	attr := "minor"
	if kind == "mig" {
		attr = "parentMinor"
	}
	class := driverName
	if kind != "gpu" {
		class = kind + "." + driverName
	}
	sel := fmt.Sprintf(`device.attributes["gpu.dra.dev"].%s == %d`, attr, minor)
	return at.Exactly(kind, class, 1, append([]string{sel}, extra...)...)
}

// withConfig adds an opaque config of the driver for some requests.
func withConfig(claim *resourceapi.ResourceClaim, params string, requests ...string) *resourceapi.ResourceClaim {
	claim.Spec.Devices.Config = append(claim.Spec.Devices.Config, resourceapi.DeviceClaimConfiguration{
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	})
	return claim
}

const (
	longTimeSlice = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`
	mpsThreads    = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50}}}`
)

// standardCluster is the fixture of the golden files and docs/kubectl-gpu.md:
// a DGX H100 and an L4 node with every way of using a GPU.
//
//	node-a gpu-0: two time-slice shares (one with interval Long)
//	node-a gpu-1, gpu-2: one claim of two whole GPUs
//	node-a gpu-3: MIG 1g.10gb ×2 and 3g.40gb
//	node-a gpu-4: an MPS share of 50% compute and 20Gi
//	node-a gpu-7: tainted
//	node-b gpu-0: a whole L4 in namespace team-b
//	a pending claim for a 7g.80gb MIG device
func standardCluster(t testing.TB) *fixture {
	t.Helper()
	f := newFixture(t, "node-a=dgxh100", "node-b=l4x4")
	f.taint("node-a", "gpu-7", resourceapi.DeviceTaint{Key: "gpu.dra.dev/unhealthy", Value: "XID79-reboot-required", Effect: resourceapi.DeviceTaintEffectNoExecute})
	f.run("node-a", "default", withConfig(at.Claim("ts-a", onGPU(0, "timeslice")), longTimeSlice))
	f.run("node-a", "default", at.Claim("ts-b", onGPU(0, "timeslice")))
	f.run("node-a", "default", at.Claim("train",
		at.Exactly("gpus", driverName, 2, `device.attributes["gpu.dra.dev"].minor in [1, 2]`)))
	f.run("node-a", "default", at.Claim("mig-small-1", onGPU(3, "mig", at.Profile("1g.10gb"))))
	f.run("node-a", "default", at.Claim("mig-small-2", onGPU(3, "mig", at.Profile("1g.10gb"))))
	f.run("node-a", "default", at.Claim("mig-medium", onGPU(3, "mig", at.Profile("3g.40gb"))))
	f.run("node-a", "default", withConfig(at.Claim("mps-a",
		at.WithCapacity(onGPU(4, "mps"), map[string]string{"compute": "50", "memory": "20Gi"})), mpsThreads, "mps"))
	f.run("node-b", "team-b", at.Claim("infer", at.Exactly("gpu", driverName, 1)))
	f.pending("default", at.Claim("waiting", at.Exactly("mig", "mig."+driverName, 1, at.Profile("7g.80gb"))))
	return f
}
