package mpspod

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/podkubelet"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/mpscontrol"
	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

// envRunControl makes the test binary run as the simulated
// nvidia-cuda-mps-control: the pods' command is this binary.
const envRunControl = "MPSPOD_TEST_RUN_MPS_CONTROL"

func TestMain(m *testing.M) {
	if os.Getenv(envRunControl) == "1" {
		os.Exit(mpscontrol.Main(os.Args, os.Getenv, os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

const (
	namespace = "gpu-dra"
	node      = "node-a"
)

var owner = &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "plugin", UID: "ds-uid"}

// rig is an MPS manager whose daemons run as pods, started by a kubelet
// stand-in as local processes.
type rig struct {
	t       *testing.T
	client  *fake.Clientset
	opts    sharing.MPSOptions
	gpu     sharing.DeviceRef
	kubelet *podkubelet.Kubelet
}

func newRig(t *testing.T) *rig {
	t.Helper()
	// Short: unix sockets live below it.
	dir, err := os.MkdirTemp("", "mpspod")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	machine, err := nvmlsim.New("dgxh100", nvmlsim.WithSeed(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if ret := machine.Init(); ret != nvml.SUCCESS {
		t.Fatalf("NVML init: %v", ret)
	}
	t.Cleanup(func() { machine.Shutdown() })
	client := fake.NewClientset()
	apiserver.GenerateNames(client)
	kubelet, err := podkubelet.Start(client, namespace)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kubelet.Stop)
	return &rig{
		t: t, client: client, kubelet: kubelet,
		gpu: sharing.DeviceRef{UUID: machine.GPUUUID(0), Index: 0},
		opts: sharing.MPSOptions{
			Dir: filepath.Join(dir, "mps"), ControlBinary: self,
			ComputeModes: sharing.NewNVMLComputeModes(machine),
			StartTimeout: 20 * time.Second,
			// For the control client the manager runs, and the daemons.
			Env: []string{envRunControl + "=1"},
		},
	}
}

// manager is a new plugin instance's MPS manager over the same directories
// and API.
func (r *rig) manager() *sharing.MPSManager {
	r.t.Helper()
	l, err := New(Options{
		Client: r.client, Namespace: namespace, NodeName: node, DriverName: "gpu.dra.dev",
		Image: "registry.example/gpu-dra-driver:v1", Owner: owner, PriorityClassName: "system-node-critical",
		Mounts: []cdi.Mount{{HostPath: "/run/nvidia/driver", ContainerPath: "/driver-root"}},
	})
	if err != nil {
		r.t.Fatal(err)
	}
	opts := r.opts
	opts.Launcher = l
	m, err := sharing.NewMPSManager(opts)
	if err != nil {
		r.t.Fatal(err)
	}
	return m
}

func (r *rig) pods() []corev1.Pod {
	r.t.Helper()
	list, err := r.client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	return list.Items
}

// daemonPID is the PID in the device's pid file.
func (r *rig) daemonPID(res *sharing.Result) int {
	r.t.Helper()
	data, err := os.ReadFile(filepath.Join(filepath.Dir(res.PipeDir), "pipe", "nvidia-cuda-mps-control.pid"))
	if err != nil {
		r.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		r.t.Fatal(err)
	}
	return pid
}

// waitNoPods waits until the launcher's pods are gone.
func (r *rig) waitNoPods() {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(r.pods()) > 0 {
		if time.Now().After(deadline) {
			r.t.Fatalf("pods left: %v", podNames(r.pods()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func podNames(pods []corev1.Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return names
}

// A device's first share starts its daemon in a pod on the node; a new
// plugin instance adopts the running daemon (same pod, same process) instead
// of starting another; the last share's release stops it and deletes the pod.
func TestDaemonPodOutlivesPlugin(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	r := newRig(t)

	res, err := r.manager().Acquire(ctx, r.gpu, sharing.MPSShare{ID: "claim-a"})
	if err != nil {
		t.Fatal(err)
	}
	pods := r.pods()
	if len(pods) != 1 {
		t.Fatalf("%d pods after the first share, want 1: %v", len(pods), podNames(pods))
	}
	pod := pods[0]
	checkPod(t, &pod, r.opts.ControlBinary, r.gpu.UUID)
	pid := r.daemonPID(res)

	// The plugin restarts: its process launcher would be gone with it, the
	// pod is not.
	if err := r.manager().Reconcile(ctx, []sharing.ShareRef{{Device: r.gpu, ID: "claim-a"}}); err != nil {
		t.Fatal(err)
	}
	if got := r.pods(); len(got) != 1 || got[0].UID != pod.UID {
		t.Errorf("pods after the restart: %v, want the same pod %s", podNames(got), pod.Name)
	}
	if got := r.daemonPID(res); got != pid {
		t.Errorf("daemon PID %d after the restart, want the adopted %d", got, pid)
	}

	// A second share joins the running daemon.
	m := r.manager()
	if _, err := m.Acquire(ctx, r.gpu, sharing.MPSShare{ID: "claim-b"}); err != nil {
		t.Fatal(err)
	}
	if got := r.pods(); len(got) != 1 || got[0].UID != pod.UID {
		t.Errorf("pods after a second share: %v, want the same pod %s", podNames(got), pod.Name)
	}

	for _, id := range []string{"claim-a", "claim-b"} {
		if err := m.Release(ctx, r.gpu, id); err != nil {
			t.Fatal(err)
		}
	}
	r.waitNoPods()
	if processAlive(pid) {
		t.Errorf("daemon %d still runs after the last share was released", pid)
	}
}

// With ShmSize the device gets a tmpfs that the daemon pod and every client
// mount at /dev/shm; the last share's release unmounts and removes it.
func TestDaemonPodSharesShm(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	r := newRig(t)
	r.opts.ShmSize = 64 << 20
	m := r.manager()
	res, err := m.Acquire(ctx, r.gpu, sharing.MPSShare{ID: "claim-a"})
	if err != nil {
		if strings.Contains(err.Error(), "operation not permitted") {
			t.Skipf("mounting a tmpfs needs CAP_SYS_ADMIN: %v", err)
		}
		t.Fatal(err)
	}
	shm := filepath.Join(filepath.Dir(res.PipeDir), "shm")
	var st unix.Statfs_t
	if err := unix.Statfs(shm, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		t.Errorf("%s is not a tmpfs (%v)", shm, err)
	}
	if !slices.ContainsFunc(res.Edits.Mounts, func(mt cdi.Mount) bool { return mt.HostPath == shm && mt.ContainerPath == "/dev/shm" }) {
		t.Errorf("client edits %+v do not mount %s at /dev/shm", res.Edits.Mounts, shm)
	}
	pod := r.pods()[0]
	var daemonShm string
	for _, v := range pod.Spec.Volumes {
		for _, vm := range pod.Spec.Containers[0].VolumeMounts {
			if vm.Name == v.Name && vm.MountPath == "/dev/shm" {
				daemonShm = v.HostPath.Path
			}
		}
	}
	if daemonShm != shm {
		t.Errorf("daemon pod mounts %q at /dev/shm, want %s", daemonShm, shm)
	}
	if err := m.Release(ctx, r.gpu, "claim-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(shm); !os.IsNotExist(err) {
		t.Errorf("%s left after the last share: %v", shm, err)
	}
}

// A daemon whose pod died is started again in a new pod by the next share,
// and the dead pod is deleted.
func TestDeadDaemonPodIsReplaced(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	r := newRig(t)
	m := r.manager()
	res, err := m.Acquire(ctx, r.gpu, sharing.MPSShare{ID: "claim-a"})
	if err != nil {
		t.Fatal(err)
	}
	old := r.pods()[0]
	pid := r.daemonPID(res)
	p, _ := os.FindProcess(pid)
	_ = p.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for processAlive(pid) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}

	if _, err := m.Acquire(ctx, r.gpu, sharing.MPSShare{ID: "claim-b"}); err != nil {
		t.Fatal(err)
	}
	pods := r.pods()
	if len(pods) != 1 || pods[0].UID == old.UID {
		t.Fatalf("pods after the restart of a dead daemon: %v, want one new pod (old %s)", podNames(pods), old.Name)
	}
	if got := r.daemonPID(res); got == pid || !processAlive(got) {
		t.Errorf("daemon PID %d, want a new running daemon (old %d)", got, pid)
	}
}

// A daemon pod that fails ends the wait at once, with the pod's state in
// the error, and is cleaned up.
func TestFailedDaemonPodFailsFast(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	r := newRig(t)
	r.opts.ControlBinary = "/nonexistent/nvidia-cuda-mps-control"
	start := time.Now()
	_, err := r.manager().Acquire(ctx, r.gpu, sharing.MPSShare{ID: "claim-a"})
	if err == nil {
		t.Fatal("Acquire succeeded with a daemon that cannot start")
	}
	for _, want := range []string{"pod " + namespace + "/mps-gpu-", "is Failed", "StartError"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if took := time.Since(start); took > r.opts.StartTimeout/2 {
		t.Errorf("Acquire took %v to give up on a failed pod (start timeout %v)", took, r.opts.StartTimeout)
	}
	r.waitNoPods()
}

// Reconcile deletes daemon pods of devices without shares, e.g. left by a
// teardown that crashed after stopping the daemon.
func TestReconcilePrunesStrayPods(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	r := newRig(t)
	l, err := New(Options{Client: r.client, Namespace: namespace, NodeName: node, DriverName: "gpu.dra.dev", Image: "img"})
	if err != nil {
		t.Fatal(err)
	}
	stray := l.pod(sharing.Daemon{Name: "gpu-0123456789ab", Binary: "/bin/sleep", PipeDir: "/p", LogDir: "/l"})
	stray.Spec.Containers[0].Command = []string{"/bin/sleep", "600"}
	other := l.pod(sharing.Daemon{Name: "gpu-0123456789ab", Binary: "/bin/true"})
	other.Spec.NodeName = "node-b" // another node's plugin owns it
	for _, p := range []*corev1.Pod{stray, other} {
		if _, err := r.client.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.manager().Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	pods := r.pods()
	if len(pods) != 1 || pods[0].Spec.NodeName != "node-b" {
		t.Errorf("pods after Reconcile: %v, want only node-b's", podNames(pods))
	}
}

func checkPod(t *testing.T, pod *corev1.Pod, binary, uuid string) {
	t.Helper()
	c := pod.Spec.Containers[0]
	var env []string
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	var mounts []string
	for _, m := range c.VolumeMounts {
		mounts = append(mounts, m.MountPath)
	}
	for what, ok := range map[string]bool{
		"bound to the node":                    pod.Spec.NodeName == node,
		"in the host's PID namespace":          pod.Spec.HostPID,
		"never restarted by the kubelet":       pod.Spec.RestartPolicy == corev1.RestartPolicyNever,
		"owned by the plugin's DaemonSet":      len(pod.OwnerReferences) == 1 && pod.OwnerReferences[0].UID == owner.UID,
		"tolerating every taint":               len(pod.Spec.Tolerations) == 1 && pod.Spec.Tolerations[0].Operator == corev1.TolerationOpExists,
		"node-critical":                        pod.Spec.PriorityClassName == "system-node-critical",
		"without an API token":                 pod.Spec.AutomountServiceAccountToken != nil && !*pod.Spec.AutomountServiceAccountToken,
		"running the control daemon -f":        slices.Equal(c.Command, []string{binary, "-f"}),
		"on the device":                        slices.Contains(env, "CUDA_VISIBLE_DEVICES="+uuid),
		"with the driver root":                 slices.Contains(mounts, "/driver-root"),
		"labelled with its device directory":   pod.Labels["gpu.dra.dev/mps-daemon"] != "" && pod.Labels["app.kubernetes.io/component"] == Component,
		"with the pipe and log directories":    len(mounts) == 3 && slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "CUDA_MPS_PIPE_DIRECTORY="+mounts[0]) }),
		"privileged (GPU device nodes)":        c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged,
		"named after its device for operators": strings.HasPrefix(pod.Name, "mps-gpu-"),
	} {
		if !ok {
			t.Errorf("daemon pod is not %s: %+v", what, pod)
		}
	}
}

func processAlive(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(data), ')')
	fields := strings.Fields(string(data[i+1:]))
	return len(fields) > 0 && fields[0] != "Z" && fields[0] != "X"
}
