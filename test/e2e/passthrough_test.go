package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// launcherScript does with a DRA GPU what KubeVirt's virt-launcher does (its
// GPUs-with-DRA path): read the device metadata for the PCI address and the
// VFIO group device, open the group device (read-write, as a VMM does), and
// find the PCI address among the group's devices in sysfs. The simulated
// sysfs is mounted at /sys-sim in place of the host's /sys. It prints
// "launcher ok <pci address> <group>" and goes on running (as the VM would),
// or says what failed and exits 1.
const launcherScript = `set -eu
md=$1
[ -r "$md" ] || { echo "launcher: no metadata at $md"; exit 1; }
# The first object of the stream is the newest version; each attribute is
# "<name>":{"string":"<value>"}.
attr() { tr -d '\n ' < "$md" | sed -n "s|.*\"$1\":{\"string\":\"\([^\"]*\)\"}.*|\1|p" | head -n 1; }
addr=$(attr 'resource.kubernetes.io/pciBusID')
vfio=$(attr vfioDevice)
[ -n "$addr" ] || { echo "launcher: no pciBusID in the metadata"; cat "$md"; exit 1; }
case $vfio in /dev/vfio/[0-9]*) ;; *) echo "launcher: vfioDevice '$vfio' is not a VFIO group device"; exit 1 ;; esac
[ -c "$vfio" ] || { echo "launcher: $vfio is not a character device here"; exit 1; }
[ -c /dev/vfio/vfio ] || { echo "launcher: no VFIO container /dev/vfio/vfio"; exit 1; }
exec 3<>"$vfio" || { echo "launcher: cannot open $vfio"; exit 1; }
exec 3>&-
group=${vfio#/dev/vfio/}
dev=/sys-sim/bus/pci/devices/$addr
[ "$(readlink "$dev/driver" | sed 's|.*/||')" = vfio-pci ] || { echo "launcher: $addr is not bound to vfio-pci"; exit 1; }
[ "$(readlink "$dev/iommu_group" | sed 's|.*/||')" = "$group" ] || { echo "launcher: $addr is not in IOMMU group $group"; exit 1; }
[ -e "/sys-sim/kernel/iommu_groups/$group/devices/$addr" ] || { echo "launcher: group $group does not list $addr"; ls "/sys-sim/kernel/iommu_groups/$group/devices"; exit 1; }
echo "launcher ok $addr $group"
exec sleep 86400
`

// TestPassthroughLauncher: with passthrough in the device policy, a
// KubeVirt-shaped pod gets a GPU through the vfio DeviceClass, reads the
// device metadata, opens the VFIO group device it names and finds the PCI
// address in that group; meanwhile the GPU is on vfio-pci and out of NVML.
// Deleting the pod gives the GPU back to nvidia.
func TestPassthroughLauncher(t *testing.T) {
	ctx := testContext(t)
	saveRelease(t, ctx)
	old := pluginPod(t, ctx)
	helm(t, ctx, "upgrade", env.release, chartDir(), "-n", env.namespace, "--reuse-values",
		"--set", "devicePolicy.default.passthrough=true", "--wait", "--timeout", "3m")
	waitNewPluginPod(t, ctx, old.UID)
	waitVFIOPublished(t, ctx)

	// The simulated sysfs as the node sees it: under the plugin data
	// directory the plugin pod mounts from the node.
	plugin := pluginPod(t, ctx)
	var dataDir string
	for _, v := range plugin.Spec.Volumes {
		if v.Name == "plugin-data" && v.HostPath != nil {
			dataDir = v.HostPath.Path
		}
	}
	if dataDir == "" {
		t.Fatalf("plugin pod %s has no plugin-data hostPath volume", plugin.Name)
	}
	simSys := filepath.Join(dataDir, "simulated-"+env.simulate, "sys")
	hostSys := filepath.Join(env.pluginDataDir, "simulated-"+env.simulate, "sys") // this process's view

	ns := newNamespace(t, ctx, "e2e-passthrough")
	claimTemplate(t, ctx, ns, "vm", resourceapi.ExactDeviceRequest{DeviceClassName: "vfio." + driverName})
	pod := virtLauncherPod(ns, "virt-launcher", "vm", simSys)
	if _, err := env.cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, pod.Name, err)
	}
	logs := waitLauncher(t, ctx, ns, pod.Name)
	got, err := env.cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim := podClaim(t, ctx, got)
	published := allocatedDevice(t, ctx, claim)
	addr := stringAttr(published.Attributes[vocabulary.AttrPCIBusID])
	if !strings.Contains(logs, "launcher ok "+addr+" ") {
		t.Errorf("the launcher found %q, the claim got the GPU at %s", strings.TrimSpace(logs), addr)
	}
	// Prepared (the launcher runs): the GPU is on vfio-pci.
	if d := pciDriver(hostSys, addr); d != "vfio-pci" {
		t.Errorf("GPU %s bound to %q while its claim is prepared, want vfio-pci", addr, d)
	}

	deletePod(t, ctx, ns, pod.Name)
	waitGone(t, ctx, cdiSpecPath(claim), "CDI spec of the deleted launcher pod")
	if d := pciDriver(hostSys, addr); d != "nvidia" {
		t.Errorf("GPU %s bound to %q after unprepare, want nvidia", addr, d)
	}
	// Back on nvidia, the GPU is usable whole again.
	claimTemplate(t, ctx, ns, "gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driverName,
		Selectors: celSelector(`device.attributes["resource.kubernetes.io"].pciBusID == "` + addr + `"`)})
	whole := claimPod(t, ctx, ns, "gpu", "gpu")
	if uuid := containerEnv(t, ctx, whole, "NVIDIA_VISIBLE_DEVICES"); uuid != stringAttr(published.Attributes[vocabulary.AttrUUID]) {
		t.Errorf("the GPU given back runs %q, want %s", uuid, stringAttr(published.Attributes[vocabulary.AttrUUID]))
	}
	deletePod(t, ctx, ns, "gpu")
}

// virtLauncherPod runs launcherScript once with the claim from template (pod
// claim "dev", request "dev") and the node's simulated sysfs at /sys-sim.
func virtLauncherPod(ns, name, template, simSys string) *corev1.Pod {
	spec := sleeperSpec(corev1.PodResourceClaim{Name: "dev", ResourceClaimTemplateName: &template})
	spec.RestartPolicy = corev1.RestartPolicyNever
	ctr := &spec.Containers[0]
	ctr.Command = []string{"sh", "-c", launcherScript, "launcher", metadataPath}
	ctr.VolumeMounts = []corev1.VolumeMount{{Name: "sys-sim", MountPath: "/sys-sim", ReadOnly: true}}
	spec.Volumes = []corev1.Volume{{Name: "sys-sim", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: simSys, Type: ptr.To(corev1.HostPathDirectory)},
	}}}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
}

// waitVFIOPublished waits until the node publishes passthrough devices.
func waitVFIOPublished(t *testing.T, ctx context.Context) {
	t.Helper()
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		for _, s := range nodeSlices(t, ctx, env.node) {
			for _, d := range s.Spec.Devices {
				if stringAttr(d.Attributes[vocabulary.AttrType]) == string(vocabulary.KindVFIO) {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("node %s publishes no passthrough device with devicePolicy.default.passthrough: %v", env.node, err)
	}
}

// waitLauncher waits until the launcher pod says it found its GPU, and
// returns its logs; it fails the test if the pod ends first.
func waitLauncher(t *testing.T, ctx context.Context, ns, name string) string {
	t.Helper()
	var phase corev1.PodPhase
	var logs string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		p, err := env.cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		phase = p.Status.Phase
		if phase == corev1.PodPending {
			return false, nil
		}
		data, err := env.cluster.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: "ctr"}).DoRaw(ctx)
		if err != nil {
			return false, nil // the container may not have started yet
		}
		logs = string(data)
		return strings.Contains(logs, "launcher ok ") || phase == corev1.PodSucceeded || phase == corev1.PodFailed, nil
	})
	if err != nil || !strings.Contains(logs, "launcher ok ") {
		evs, _ := env.runner.PodEvents(ctx, ns, name)
		t.Fatalf("launcher pod %s/%s (phase %s, %v):\n%s\nevents: %s", ns, name, phase, err, logs, strings.Join(evs, "; "))
	}
	return logs
}

// pciDriver is the driver PCI device addr is bound to in the sysfs tree at
// root ("" while unbound).
func pciDriver(root, addr string) string {
	target, err := os.Readlink(filepath.Join(root, "bus/pci/devices", addr, "driver"))
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}
