package scenarios

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Check returns what is wrong with a report, checked the same way for every
// scenario: pods are in their expected phase, and each container of a running pod
// sees exactly what its claims of r.Driver were allocated — the UUIDs in
// NVIDIA_VISIBLE_DEVICES and nvidia-smi -L, the GPU's device node, the MPS pipe
// directory of an MPS share.
func (r *Runner) Check(rep *PodReport) []string {
	var problems []string
	fail := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf("pod %s/%s: ", rep.Namespace, rep.Name)+fmt.Sprintf(format, args...))
	}
	if rep.ExpectPending {
		if rep.Phase != corev1.PodPending || rep.Node != "" {
			fail("must stay Pending and unbound, is %s on %q", rep.Phase, rep.Node)
		}
		return problems
	}
	if rep.Phase != corev1.PodRunning {
		fail("is %s, not Running: %s", rep.Phase, strings.Join(rep.Events, "; "))
		return problems
	}
	var devices []DeviceReport
	for _, c := range rep.Claims {
		if len(c.Devices) == 0 {
			fail("claim %s is not allocated", c.Name)
		}
		for _, d := range c.Devices {
			if d.Driver == r.Driver {
				devices = append(devices, d)
			}
		}
	}
	for _, name := range rep.ContainerOrder {
		v := rep.Containers[name]
		if v.Err != nil {
			fail("container %s: %v", name, v.Err)
			continue
		}
		if len(devices) == 0 {
			continue
		}
		visible := strings.Split(v.Env["NVIDIA_VISIBLE_DEVICES"], ",")
		if !slices.Contains(v.DevNodes, "/dev/nvidiactl") {
			fail("container %s has no /dev/nvidiactl (has %v)", name, v.DevNodes)
		}
		for _, d := range devices {
			if gpu := d.GPU(); gpu != "" && !slices.Contains(v.DevNodes, "/dev/nvidia"+gpu) {
				fail("container %s has no /dev/nvidia%s for %s (has %v)", name, gpu, d.Device, v.DevNodes)
			}
			switch uuid := d.UUID(); {
			case uuid != "":
				if !slices.Contains(visible, uuid) {
					fail("container %s: NVIDIA_VISIBLE_DEVICES=%q lacks %s of %s", name, v.Env["NVIDIA_VISIBLE_DEVICES"], uuid, d.Device)
				}
				if !strings.Contains(v.NvidiaSMI, "UUID: "+uuid) {
					fail("container %s: nvidia-smi -L does not list %s of %s:\n%s", name, uuid, d.Device, v.NvidiaSMI)
				}
			case deviceKind(d.Attributes) == vocabulary.KindMIG:
				if !slices.ContainsFunc(visible, func(s string) bool { return strings.HasPrefix(s, "MIG-") }) {
					fail("container %s: NVIDIA_VISIBLE_DEVICES=%q names no MIG device for %s", name, v.Env["NVIDIA_VISIBLE_DEVICES"], d.Device)
				}
				if !strings.Contains(v.NvidiaSMI, "MIG "+d.Attributes[vocabulary.AttrProfile]) {
					fail("container %s: nvidia-smi -L shows no %s MIG device:\n%s", name, d.Attributes[vocabulary.AttrProfile], v.NvidiaSMI)
				}
			}
			if deviceKind(d.Attributes) == vocabulary.KindMPS || (deviceKind(d.Attributes) == vocabulary.KindMIG && v.Env["CUDA_MPS_PIPE_DIRECTORY"] != "") {
				if v.Env["CUDA_MPS_PIPE_DIRECTORY"] == "" {
					fail("container %s: no CUDA_MPS_PIPE_DIRECTORY for MPS share %s", name, d.Device)
				} else if !slices.Contains(v.MPSPipe, "control") {
					fail("container %s: MPS pipe directory %s has no control socket (has %v)", name, v.Env["CUDA_MPS_PIPE_DIRECTORY"], v.MPSPipe)
				}
				// The chart runs the daemon in a pod of its own (kubeletPlugin.mpsDaemonPods).
				if len(d.MPSDaemons) != 1 || !strings.HasSuffix(d.MPSDaemons[0], "(Running)") {
					fail("MPS device %s: want one running MPS control daemon pod for it, have %v", d.Device, d.MPSDaemons)
				}
			}
		}
	}
	return problems
}
