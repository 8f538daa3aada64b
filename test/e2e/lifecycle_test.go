package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// workload is a set of running pods with prepared claims of every kind.
type workload struct {
	ns     string
	pods   map[string]*corev1.Pod
	claims map[string]*resourceapi.ResourceClaim
	// migUUID is the MIG device the "mig" pod sees.
	migUUID string
	// specs holds each claim's CDI spec as prepared.
	specs map[string][]byte
	// mpsDaemon is the pod running the "mps" pod's MPS control daemon, and
	// mpsPID the daemon's PID (its pid file, as the container sees it).
	mpsUUID   string
	mpsDaemon *corev1.Pod
	mpsPID    string
	// mpsShm is the host tmpfs the MPS pod and its daemon see as /dev/shm.
	mpsShm string
}

// mpsShmProbe is a file the mps pod writes to its /dev/shm.
const mpsShmProbe = "e2e-probe"

// shmMount returns the host path a CDI spec mounts at /dev/shm.
func shmMount(t *testing.T, spec []byte) string {
	t.Helper()
	var s cdispec.Spec
	if err := json.Unmarshal(spec, &s); err != nil {
		t.Fatal(err)
	}
	for _, d := range s.Devices {
		for _, m := range d.ContainerEdits.Mounts {
			if m.ContainerPath == "/dev/shm" {
				return m.HostPath
			}
		}
	}
	t.Fatalf("the MPS claim's CDI spec mounts nothing at /dev/shm:\n%s", spec)
	return ""
}

// checkMPSShm checks that the MPS pod's /dev/shm is the device's tmpfs on the
// host, shared with its daemon pod, and still holds the probe.
func (w *workload) checkMPSShm(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	if env.nodeLocal != "" {
		// The local cluster: the tmpfs is mounted in the node's namespace.
		out, err := nodeExec(t, ctx, env.node, "stat", "-f", "-c", "%T", w.mpsShm)
		if err != nil || strings.TrimSpace(out) != "tmpfs" {
			t.Errorf("%s: %s is not a tmpfs on node %s (%v: %s)", when, w.mpsShm, env.node, err, out)
		}
		if out, err := nodeExec(t, ctx, env.node, "test", "-e", filepath.Join(w.mpsShm, mpsShmProbe)); err != nil {
			t.Errorf("%s: the mps pod's /dev/shm/%s is not in node %s's %s (%v %s)", when, mpsShmProbe, env.node, w.mpsShm, err, out)
		}
	} else {
		var st unix.Statfs_t
		if err := unix.Statfs(w.mpsShm, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
			t.Errorf("%s: %s is not a tmpfs on the host (%v)", when, w.mpsShm, err)
		}
		if !fileExists(filepath.Join(w.mpsShm, mpsShmProbe)) {
			t.Errorf("%s: the mps pod's /dev/shm/%s is not in the host's %s", when, mpsShmProbe, w.mpsShm)
		}
	}
	found := false
	for _, v := range w.mpsDaemon.Spec.Volumes {
		for _, vm := range w.mpsDaemon.Spec.Containers[0].VolumeMounts {
			found = found || (vm.Name == v.Name && vm.MountPath == "/dev/shm" && v.HostPath != nil && v.HostPath.Path == w.mpsShm)
		}
	}
	if !found {
		t.Errorf("%s: MPS daemon pod %s does not mount %s at /dev/shm", when, w.mpsDaemon.Name, w.mpsShm)
	}
}

// mpsPIDFile is the control daemon's pid file, in the MPS pipe directory.
const mpsPIDFile = `"$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"`

// mpsDaemonPods are the MPS control daemon pods the plugin runs for the
// device with this UUID.
func mpsDaemonPods(t *testing.T, ctx context.Context, uuid string) []corev1.Pod {
	t.Helper()
	pods, err := env.cluster.Client.CoreV1().Pods(env.namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=mps-control-daemon"})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.Annotations[driverName+"/device"] == uuid {
			out = append(out, p)
		}
	}
	return out
}

// startWorkload runs a whole-GPU, a MIG, a time-slicing and an MPS pod.
func startWorkload(t *testing.T, ctx context.Context, ns string) *workload {
	t.Helper()
	newNamespace(t, ctx, ns)
	class := func(prefix string) string {
		if prefix == "" {
			return driverName
		}
		return prefix + "." + driverName
	}
	claimTemplate(t, ctx, ns, "gpu", resourceapi.ExactDeviceRequest{DeviceClassName: class("")})
	claimTemplate(t, ctx, ns, "mig", resourceapi.ExactDeviceRequest{DeviceClassName: class("mig"),
		Selectors: celSelector(`device.attributes["gpu.dra.dev"].profile == "2g.20gb"`)})
	claimTemplate(t, ctx, ns, "ts", resourceapi.ExactDeviceRequest{DeviceClassName: class("timeslice")})
	claimTemplate(t, ctx, ns, "mps", resourceapi.ExactDeviceRequest{DeviceClassName: class("mps")})
	w := &workload{ns: ns, pods: map[string]*corev1.Pod{}, claims: map[string]*resourceapi.ResourceClaim{}, specs: map[string][]byte{}}
	for _, name := range []string{"gpu", "mig", "ts", "mps"} {
		pod := claimPod(t, ctx, ns, name, name)
		w.pods[name] = pod
		w.claims[name] = podClaim(t, ctx, pod)
		spec, err := os.ReadFile(cdiSpecPath(w.claims[name]))
		if err != nil {
			t.Fatalf("pod %s is running but its claim has no CDI spec: %v", name, err)
		}
		w.specs[name] = spec
	}
	// The MPS daemon runs in a pod of its own, outside the plugin's container.
	w.mpsUUID = containerEnv(t, ctx, w.pods["mps"], "NVIDIA_VISIBLE_DEVICES")
	if err := poll(ctx, func(context.Context) (bool, error) {
		daemons := mpsDaemonPods(t, ctx, w.mpsUUID)
		if len(daemons) != 1 || daemons[0].Status.Phase != corev1.PodRunning {
			return false, nil
		}
		w.mpsDaemon = &daemons[0]
		return true, nil
	}); err != nil {
		t.Fatalf("want one running MPS control daemon pod for %s, have %+v", w.mpsUUID, mpsDaemonPods(t, ctx, w.mpsUUID))
	}
	pid, err := env.cluster.Exec(ctx, ns, "mps", "ctr", "sh", "-c", "cat "+mpsPIDFile)
	if err != nil || strings.TrimSpace(pid) == "" {
		t.Fatalf("the mps pod sees no MPS control daemon pid file: %v %q", err, pid)
	}
	w.mpsPID = strings.TrimSpace(pid)
	w.mpsShm = shmMount(t, w.specs["mps"])
	if _, err := env.cluster.Exec(ctx, ns, "mps", "ctr", "sh", "-c", "echo probe > /dev/shm/"+mpsShmProbe); err != nil {
		t.Fatalf("write to the mps pod's /dev/shm: %v", err)
	}
	w.checkMPSShm(t, ctx, "after start")
	w.migUUID = containerEnv(t, ctx, w.pods["mig"], "NVIDIA_VISIBLE_DEVICES")
	if _, ok := migUUIDs(t)[w.migUUID]; !ok {
		t.Fatalf("the mig pod sees %q, not a MIG instance of the simulated machine", w.migUUID)
	}
	return w
}

// verifyIntact checks that the workload's pods still run in the same containers
// and that the node still has what their claims prepared: CDI specs unchanged,
// the MIG instance, the MPS daemon's control socket.
func (w *workload) verifyIntact(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	for name, before := range w.pods {
		pod, err := env.cluster.Client.CoreV1().Pods(w.ns).Get(ctx, before.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: pod %s: %v", when, name, err)
		}
		if pod.Status.Phase != corev1.PodRunning {
			t.Errorf("%s: pod %s is %s", when, name, pod.Status.Phase)
		}
		if got, was := containerIDs(pod), containerIDs(before); got != was {
			t.Errorf("%s: pod %s: containers changed from %s to %s", when, name, was, got)
		}
		spec, err := os.ReadFile(cdiSpecPath(w.claims[name]))
		if err != nil {
			t.Errorf("%s: CDI spec of pod %s: %v", when, name, err)
		} else if string(spec) != string(w.specs[name]) {
			t.Errorf("%s: CDI spec of pod %s changed", when, name)
		}
	}
	if _, ok := migUUIDs(t)[w.migUUID]; !ok {
		t.Errorf("%s: MIG instance %s of the running mig pod is gone", when, w.migUUID)
	}
	// The MPS daemon is the very one the container's CUDA processes were
	// connected to: same pod, same process, control socket in place.
	if out, err := env.cluster.Exec(ctx, w.ns, "mps", "ctr", "sh", "-c", `ls "$CUDA_MPS_PIPE_DIRECTORY"`); err != nil || !strings.Contains(out, "control") {
		t.Errorf("%s: the MPS pod's pipe directory has no control socket (%v %q)", when, err, out)
	}
	if pid, err := env.cluster.Exec(ctx, w.ns, "mps", "ctr", "sh", "-c", "cat "+mpsPIDFile); err != nil || strings.TrimSpace(pid) != w.mpsPID {
		t.Errorf("%s: the MPS control daemon's PID is %q (%v), was %s: the daemon was restarted", when, strings.TrimSpace(pid), err, w.mpsPID)
	}
	daemons := mpsDaemonPods(t, ctx, w.mpsUUID)
	if len(daemons) != 1 || daemons[0].UID != w.mpsDaemon.UID || daemons[0].Status.Phase != corev1.PodRunning {
		t.Errorf("%s: MPS control daemon pods %+v, want the running pod %s", when, daemons, w.mpsDaemon.Name)
	}
	// The tmpfs the plugin mounted outlives it (Bidirectional propagation).
	w.checkMPSShm(t, ctx, when)
}

func containerIDs(pod *corev1.Pod) string {
	var ids []string
	for _, s := range pod.Status.ContainerStatuses {
		ids = append(ids, fmt.Sprintf("%s@%d", s.ContainerID, s.RestartCount))
	}
	return strings.Join(ids, ",")
}

// verifyUnprepare deletes the workload's pods and checks that the node is cleaned
// up: CDI specs removed, the MIG instance destroyed.
func (w *workload) verifyUnprepare(t *testing.T, ctx context.Context) {
	t.Helper()
	for name := range w.pods {
		deletePod(t, ctx, w.ns, name)
	}
	for name, claim := range w.claims {
		waitGone(t, ctx, cdiSpecPath(claim), "CDI spec of deleted pod "+name)
	}
	if err := poll(ctx, func(context.Context) (bool, error) {
		_, ok := migUUIDs(t)[w.migUUID]
		return !ok, nil
	}); err != nil {
		t.Errorf("MIG instance %s still exists after its pod was deleted", w.migUUID)
	}
	if err := poll(ctx, func(context.Context) (bool, error) {
		return len(mpsDaemonPods(t, ctx, w.mpsUUID)) == 0, nil
	}); err != nil {
		t.Errorf("MPS control daemon pods of %s left after the last MPS pod was deleted: %+v", w.mpsUUID, mpsDaemonPods(t, ctx, w.mpsUUID))
	}
	waitGone(t, ctx, w.mpsShm, "MPS /dev/shm tmpfs of the deleted pod")
}

// TestUnprepareOnDelete: deleting a pod unprepares its claim on the node.
func TestUnprepareOnDelete(t *testing.T) {
	ctx := testContext(t)
	w := startWorkload(t, ctx, "e2e-unprepare")
	w.verifyUnprepare(t, ctx)
}

// TestPluginRestart: a restarted plugin pod keeps what running pods were given, and
// can unprepare it afterwards.
func TestPluginRestart(t *testing.T) {
	ctx := testContext(t)
	w := startWorkload(t, ctx, "e2e-restart")
	old := pluginPod(t, ctx)
	if err := env.cluster.Client.CoreV1().Pods(env.namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitNewPluginPod(t, ctx, old.UID)
	w.verifyIntact(t, ctx, "after the plugin pod was restarted")
	// The restarted plugin prepares new claims...
	claimPod(t, ctx, w.ns, "gpu-after-restart", "gpu")
	// ...and unprepares the old ones.
	w.verifyUnprepare(t, ctx)
}

// TestHelmUpgradeKeepsClaims: `helm upgrade` that rolls the plugin keeps prepared
// claims; the new plugin serves new and old claims.
func TestHelmUpgradeKeepsClaims(t *testing.T) {
	ctx := testContext(t)
	w := startWorkload(t, ctx, "e2e-upgrade")
	old := pluginPod(t, ctx)
	helm(t, ctx, "upgrade", env.release, chartDir(), "-n", env.namespace, "--reuse-values",
		"--set", "logVerbosity=4", "--wait", "--timeout", "3m")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		helm(t, ctx, "upgrade", env.release, chartDir(), "-n", env.namespace, "--reuse-values",
			"--set", "logVerbosity=2", "--wait", "--timeout", "3m")
	})
	waitNewPluginPod(t, ctx, old.UID)
	w.verifyIntact(t, ctx, "after helm upgrade")
	claimPod(t, ctx, w.ns, "gpu-after-upgrade", "gpu")
	w.verifyUnprepare(t, ctx)
}

func pluginPod(t *testing.T, ctx context.Context) *corev1.Pod {
	t.Helper()
	pods, err := env.cluster.Client.CoreV1().Pods(env.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=kubelet-plugin",
		FieldSelector: "spec.nodeName=" + env.node,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i]
		}
	}
	t.Fatalf("no kubelet plugin pod on node %s", env.node)
	return nil
}

// waitNewPluginPod waits until a plugin pod other than old runs on the node and the
// old one is gone.
func waitNewPluginPod(t *testing.T, ctx context.Context, old types.UID) {
	t.Helper()
	waitNewPluginPodOn(t, ctx, env.node, old)
}

// waitNewPluginPodOn waits for a new plugin pod on node, as waitNewPluginPod.
func waitNewPluginPodOn(t *testing.T, ctx context.Context, node string, old types.UID) {
	t.Helper()
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		pods, err := env.cluster.Client.CoreV1().Pods(env.namespace).List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/component=kubelet-plugin",
			FieldSelector: "spec.nodeName=" + node,
		})
		if err != nil {
			return false, err
		}
		ready := false
		for _, p := range pods.Items {
			if p.UID == old {
				return false, nil
			}
			ready = ready || (p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil)
		}
		return ready, nil
	})
	if err != nil {
		t.Fatalf("no new kubelet plugin pod on %s: %v", node, err)
	}
}

func chartDir() string { return env.repoRoot + "/deployments/helm/gpu-dra-driver" }

func helm(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, env.helm, append(args, "--kubeconfig", env.cluster.Kubeconfig)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
