package mpspod

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/internal/vaptest"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mpspod/mpspodtest"
	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

const (
	release     = "rel"
	chartImage  = "registry.example/gpu-dra-driver:v9"
	pluginUser  = "system:serviceaccount:" + namespace + ":rel-gpu-dra-driver-kubelet-plugin"
	daemonSA    = "rel-gpu-dra-driver-mps-daemon"
	nodeNameKey = "authentication.kubernetes.io/node-name"
)

// TestDaemonPodPolicy evaluates the chart's MPS daemon pod admission policy
// with the API server's own CEL compiler and validator: the pod this launcher
// builds for the daemon a real MPSManager asks for is admitted; every variant
// that would give a compromised node more than that pod (another service
// account, a token, Secrets, other host paths, another command, ...) is
// denied with a message that says why. test/e2e's TestMPSDaemonPodPolicy
// does the same against a real API server.
func TestDaemonPodPolicy(t *testing.T) {
	for name, tc := range map[string]struct {
		values     []string
		driverRoot cdi.Mount
		control    string
	}{
		"host driver": {
			driverRoot: cdi.Mount{HostPath: "/run/nvidia/driver", ContainerPath: "/driver-root", ReadOnly: true},
			control:    "/driver-root/usr/bin/nvidia-cuda-mps-control",
		},
		"simulated": {
			values:  []string{"--set", "simulate=dgxh100"},
			control: "/usr/bin/mps-control-sim",
		},
	} {
		t.Run(name, func(t *testing.T) {
			kubeletDir := shortTempDir(t)
			dataDir := filepath.Join(kubeletDir, "plugins/gpu.dra.dev")
			if tc.driverRoot.HostPath == "" {
				root := filepath.Join(dataDir, "simulated-dgxh100/driver-root")
				tc.driverRoot = cdi.Mount{HostPath: root, ContainerPath: root, ReadOnly: true}
			}
			policy := chartPolicy(t, append([]string{"--set", "kubeletDir=" + kubeletDir}, tc.values...)...)
			validator := vaptest.Compile(t, policy)
			pod := launcherPod(t, filepath.Join(dataDir, "mps"), tc.control, tc.driverRoot)
			checkPolicy(t, validator, pod)
		})
	}
}

// checkPolicy runs the allowed pod and its forbidden variants through the
// policy.
func checkPolicy(t *testing.T, v *vaptest.Policy, good *corev1.Pod) {
	if msg := admit(t, v, admission.Create, good, nodeUser(node)); msg != "" {
		t.Fatalf("the launcher's pod is denied: %s\n%s", msg, toYAML(t, good))
	}
	if msg := admit(t, v, admission.Delete, good, nodeUser(node)); msg != "" {
		t.Errorf("deleting the launcher's pod is denied: %s", msg)
	}
	if msg := admit(t, v, admission.Create, good, nodeUser("other-node")); !strings.Contains(msg, "own node") {
		t.Errorf("a plugin of another node creates the pod: %q", msg)
	}
	if msg := admit(t, v, admission.Create, good, &user.DefaultInfo{Name: pluginUser}); !strings.Contains(msg, "own node") {
		t.Errorf("a credential without node creates the pod: %q", msg)
	}
	// A rolling upgrade's old instances create daemon pods of their own
	// image: any tag or digest of the chart's repository is admitted.
	digest := "@sha256:" + strings.Repeat("0123456789abcdef", 4)
	for _, image := range []string{"registry.example/gpu-dra-driver:v8", "registry.example/gpu-dra-driver" + digest,
		"registry.example/gpu-dra-driver:v8" + digest, "registry.example/gpu-dra-driver"} {
		pod := good.DeepCopy()
		pod.Spec.Containers[0].Image = image
		if msg := admit(t, v, admission.Create, pod, nodeUser(node)); msg != "" {
			t.Errorf("image %s of the driver's repository is denied: %s", image, msg)
		}
	}
	for _, image := range []string{"registry.example/gpu-dra-driver-evil:v9", "registry.example/gpu-dra-driver/sub:v9",
		"registry.example/other:v9", "registry.example/gpu-dra-driver:v9/../x", "registry.example/gpu-dra-driver@sha256:short",
		"other.example/registry.example/gpu-dra-driver:v9"} {
		pod := good.DeepCopy()
		pod.Spec.Containers[0].Image = image
		if msg := admit(t, v, admission.Create, pod, nodeUser(node)); !strings.Contains(msg, "the driver's image (registry.example/gpu-dra-driver, any tag or digest)") {
			t.Errorf("image %s: denied with %q, want the driver's image named", image, msg)
		}
	}
	variants := mpspodtest.ForbiddenVariants(good, "rel-gpu-dra-driver-kubelet-plugin")
	// Variants a real API server refuses before the policy: it looks up
	// the runtime class, it never admits ephemeral containers at create.
	variants["a runtime class"] = mpspodtest.Variant{Mutate: func(p *corev1.Pod) { p.Spec.RuntimeClassName = ptr.To("kata") }, Want: "runtime class"}
	variants["an ephemeral container"] = mpspodtest.Variant{Mutate: func(p *corev1.Pod) { p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{}} }, Want: "exactly one container"}
	variants["a path that climbs out"] = mpspodtest.Variant{Mutate: func(p *corev1.Pod) {
		p.Spec.Volumes[0].HostPath.Path += "/../../../../../../var/lib/kubelet/pki/x/pipe"
	}, Want: "only have hostPath volumes"}
	for name, tc := range variants {
		t.Run(name, func(t *testing.T) {
			pod := good.DeepCopy()
			tc.Mutate(pod)
			msg := admit(t, v, admission.Create, pod, nodeUser(node))
			switch {
			case msg == "":
				t.Errorf("admitted, want denied with %q", tc.Want)
			case !strings.Contains(msg, tc.Want):
				t.Errorf("denied with %q, want %q", msg, tc.Want)
			}
		})
	}
}

func nodeUser(node string) user.Info {
	return &user.DefaultInfo{Name: pluginUser, Extra: map[string][]string{nodeNameKey: {node}}}
}

// shortTempDir is a temporary directory with a short path: MPS sockets live
// below it.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vap")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// helmTemplate renders the chart (only the template showOnly, if set).
func helmTemplate(t *testing.T, showOnly string, values ...string) (string, error) {
	t.Helper()
	return vaptest.Render(t, "../../deployments/helm/gpu-dra-driver", release, namespace, showOnly,
		append([]string{"--set", "image.repository=registry.example/gpu-dra-driver,image.tag=v9"}, values...)...)
}

// chartPolicy is the chart's MPS daemon pod policy.
func chartPolicy(t *testing.T, values ...string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	out, err := helmTemplate(t, "templates/validatingadmissionpolicy.yaml", values...)
	if err != nil {
		t.Fatal(err)
	}
	return vaptest.Find(t, out, "-mps-daemon-pods")
}

// TestChartRefusesUnrestrictedNodePlugins: without the admission policies
// the plugin's RBAC lets any node write every node's slices and create any
// pod, so the chart installs like that only when told it is on purpose.
func TestChartRefusesUnrestrictedNodePlugins(t *testing.T) {
	out, err := helmTemplate(t, "", "--set", "validatingAdmissionPolicy.enabled=false")
	if err == nil || !strings.Contains(out, "validatingAdmissionPolicy.acknowledgeUnrestrictedNodePlugins=true") {
		t.Errorf("validatingAdmissionPolicy.enabled=false renders (%v), want a failure naming the acknowledgement:\n%s", err, out)
	}
	if _, err := helmTemplate(t, "", "--set", "validatingAdmissionPolicy.enabled=false,validatingAdmissionPolicy.acknowledgeUnrestrictedNodePlugins=true"); err != nil {
		t.Errorf("acknowledged: %v", err)
	}
}

// admit returns "" when the policy admits the operation on pod by u, else
// the message the API server reports; the policy must match the request.
func admit(t *testing.T, p *vaptest.Policy, op admission.Operation, pod *corev1.Pod, u user.Info) string {
	t.Helper()
	obj, old := runtime.Object(pod), runtime.Object(nil)
	if op == admission.Delete {
		obj, old = nil, pod
	}
	matched, denied := p.Admit(t, vaptest.Request{
		Operation: op, Object: obj, OldObject: old, Namespace: pod.Namespace, Name: pod.Name, User: u,
		Kind: schema.GroupVersionKind{Version: "v1", Kind: "Pod"}, Resource: schema.GroupVersionResource{Version: "v1", Resource: "pods"},
	})
	if !matched {
		t.Fatalf("policy does not match the plugin's request")
	}
	return denied
}

// launcherPod is the pod the launcher creates for the daemon a real
// MPSManager asks for, with the plugin's options as pkg/nodeplugin sets them from
// the chart's arguments.
func launcherPod(t *testing.T, mpsDir, control string, driverRoot cdi.Mount) *corev1.Pod {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	l, err := New(Options{
		Client: fake.NewClientset(), Namespace: namespace, NodeName: node, DriverName: "gpu.dra.dev",
		Image: chartImage, Owner: owner, PriorityClassName: "system-node-critical", ServiceAccountName: daemonSA,
		Mounts: []cdi.Mount{driverRoot},
	})
	if err != nil {
		t.Fatal(err)
	}
	capture := &capturingLauncher{Launcher: l}
	m, err := sharing.NewMPSManager(sharing.MPSOptions{
		Dir: mpsDir, ControlBinary: control, ComputeModes: noComputeModes{}, Launcher: capture, ShmSize: 1 << 20,
		Env: []string{"LD_LIBRARY_PATH=" + filepath.Join(driverRoot.ContainerPath, "usr/lib/x86_64-linux-gnu")},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Mounting the shared memory tmpfs needs root; the pod is what counts.
	_, err = m.Acquire(ctx, sharing.DeviceRef{UUID: "GPU-0c2a8e3f-1d2b-4c5e-9f00-123456789abc"}, sharing.MPSShare{ID: "claim"})
	if capture.pod == nil {
		t.Fatalf("the manager launched no daemon: %v", err)
	}
	return capture.pod
}

// capturingLauncher records the pod the launcher would create and fails the
// launch.
type capturingLauncher struct {
	*Launcher
	pod *corev1.Pod
}

func (c *capturingLauncher) Launch(_ context.Context, d sharing.Daemon) error {
	c.pod = c.Launcher.pod(d)
	c.pod.Name = c.pod.GenerateName + "x"
	return errors.New("captured")
}

type noComputeModes struct{}

func (noComputeModes) ComputeMode(context.Context, string) (nvml.ComputeMode, error) {
	return 0, sharing.ErrNotSupported
}

func (noComputeModes) SetComputeMode(context.Context, string, nvml.ComputeMode) error {
	return sharing.ErrNotSupported
}

func toYAML(t *testing.T, obj any) string {
	t.Helper()
	out, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
