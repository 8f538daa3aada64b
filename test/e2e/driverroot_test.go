package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

// TestHostDriverRoot: the plugin sees the driver root at /driver-root, the host has
// it elsewhere (as with a host-installed driver, driverRoot "/"). Here the simulated
// driver root is written to a host directory mounted like a real one
// (simulateDriverRoot): the CDI spec must name the host's paths, never the plugin's
// view, and the container must really get the driver's files and devices.
func TestHostDriverRoot(t *testing.T) {
	ctx := testContext(t)
	// The node's path (each node of the local cluster has its own), and
	// where this process sees it.
	nodeRoot := filepath.Join(filepath.Dir(env.kubeletDir), "e2e-driver-root")
	hostRoot := nodeRoot
	if env.nodeLocal != "" {
		nodeRoot = filepath.Join(env.nodeLocal, "e2e-driver-root")
		hostRoot = filepath.Join(nodeDir(t, env.node), "e2e-driver-root")
	}
	t.Cleanup(func() { _ = os.RemoveAll(hostRoot) }) // after the release is restored
	saveRelease(t, ctx)
	old := pluginPod(t, ctx)
	helm(t, ctx, "upgrade", env.release, chartDir(), "-n", env.namespace, "--reuse-values",
		"--set", "simulateDriverRoot="+nodeRoot, "--wait", "--timeout", "3m")
	waitNewPluginPod(t, ctx, old.UID)

	ns := newNamespace(t, ctx, "e2e-driver-root")
	claimTemplate(t, ctx, ns, "gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driverName})
	pod := claimPod(t, ctx, ns, "gpu", "gpu")
	claim := podClaim(t, ctx, pod)
	spec, err := os.ReadFile(cdiSpecPath(claim))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(spec), "/driver-root") {
		t.Errorf("the CDI spec names the plugin's view of the driver root:\n%s", spec)
	}
	smi := filepath.Join(nodeRoot, "usr/bin/nvidia-smi")
	if !strings.Contains(string(spec), `"`+smi+`"`) {
		t.Errorf("the CDI spec does not mount %s:\n%s", smi, spec)
	}
	if !fileExists(filepath.Join(hostRoot, "usr/bin/nvidia-smi")) {
		t.Errorf("the plugin did not write the simulated driver root to the host's %s", hostRoot)
	}
	uuid := containerEnv(t, ctx, pod, "NVIDIA_VISIBLE_DEVICES")
	out, err := env.cluster.Exec(ctx, ns, "gpu", "ctr", "nvidia-smi", "-L")
	if err != nil || uuid == "" || !strings.Contains(out, uuid) {
		t.Errorf("nvidia-smi -L in the container: %v %q, want the allocated GPU %q", err, out, uuid)
	}
	deletePod(t, ctx, ns, "gpu")
	waitGone(t, ctx, cdiSpecPath(claim), "CDI spec of the deleted pod")

	// The MPS control daemon's pod mounts the host's driver root where the
	// plugin sees it: the daemon comes up and its client finds the socket.
	claimTemplate(t, ctx, ns, "mps", resourceapi.ExactDeviceRequest{DeviceClassName: "mps." + driverName})
	claimPod(t, ctx, ns, "mps", "mps")
	if out, err := env.cluster.Exec(ctx, ns, "mps", "ctr", "sh", "-c", `ls "$CUDA_MPS_PIPE_DIRECTORY"`); err != nil || !strings.Contains(out, "control") {
		t.Errorf("the MPS pod's pipe directory has no control socket (%v %q)", err, out)
	}
	deletePod(t, ctx, ns, "mps")
}
