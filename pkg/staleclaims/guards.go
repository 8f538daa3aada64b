package staleclaims

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/podattribution"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Why a stale claim is held back: the reason label of the held metric and
// the hold event. A stale ResourceClaim says nothing about its containers:
// a tenant may delete its claim under a running pod, and a force-deleted
// pod's containers may outlive the grace period. Releasing then would hand
// an exclusive GPU to a second tenant, so a claim is released only when
// no evidence says a container may still use it.
const (
	// HeldContainer: the kubelet's PodResources API lists a container
	// with the claim and one of its prepared devices.
	HeldContainer = "kubelet_container"
	// HeldPod: a pod the claim was reserved for at prepare still exists
	// on this node and has not ended.
	HeldPod = "pod_running"
	// HeldProcess: NVML lists a process on one of the claim's devices.
	HeldProcess = "gpu_process"
	// HeldUnknown: some evidence could not be read (fail closed).
	HeldUnknown = "unknown"
)

var heldReasons = []string{HeldContainer, HeldPod, HeldProcess, HeldUnknown}

// heldError stops a release: a container may still use the claim.
type heldError struct {
	reason string
	err    error
}

func (e *heldError) Error() string { return fmt.Sprintf("held (%s): %v", e.reason, e.err) }
func (e *heldError) Unwrap() error { return e.err }

func held(reason, format string, args ...any) error {
	return &heldError{reason: reason, err: fmt.Errorf(format, args...)}
}

// unknown holds the claim because err kept a guard from looking.
func unknown(guard string, err error) error {
	return &heldError{reason: HeldUnknown, err: fmt.Errorf("%s: %w", guard, err)}
}

// inUse returns a *heldError when a container may still use c, nil when
// none can. prepared are all the claims the engine holds (for devices c
// shares with others).
func (r *Releaser) inUse(ctx context.Context, c *checkpoint.PreparedClaim, prepared []checkpoint.PreparedClaim) error {
	if err := r.kubeletContainers(ctx, c); err != nil {
		return err
	}
	if err := r.recordedPods(ctx, c); err != nil {
		return err
	}
	return r.gpuProcesses(c, prepared)
}

// kubeletContainers asks the kubelet which containers of its active pods
// use which claims. A container that uses a claim of the same name is the
// stale claim's only if the kubelet lists one of its prepared devices: a
// claim reallocated (or recreated) under that name waits for this release
// and names no device of ours before it is prepared.
func (r *Releaser) kubeletContainers(ctx context.Context, c *checkpoint.PreparedClaim) error {
	if r.opts.PodResourcesSocket == "" {
		return nil
	}
	pods, err := r.listPodResources(ctx)
	if err != nil {
		return unknown("kubelet PodResources", err)
	}
	for _, pod := range pods {
		for _, ctr := range pod.GetContainers() {
			for _, dr := range ctr.GetDynamicResources() {
				if dr.GetClaimNamespace() != c.Namespace || dr.GetClaimName() != c.Name {
					continue
				}
				for _, res := range dr.GetClaimResources() {
					if res.GetDriverName() == r.opts.DriverName && preparedHas(c, res.GetPoolName(), res.GetDeviceName(), res.GetShareId()) {
						return held(HeldContainer, "the kubelet lists container %s of pod %s/%s with device %s", ctr.GetName(), pod.GetNamespace(), pod.GetName(), res.GetDeviceName())
					}
				}
			}
		}
	}
	return nil
}

func preparedHas(c *checkpoint.PreparedClaim, pool, device, shareID string) bool {
	return slices.ContainsFunc(c.Devices, func(d checkpoint.PreparedDevice) bool {
		return d.Pool == pool && d.Device == device && d.ShareID == shareID
	})
}

func (r *Releaser) listPodResources(ctx context.Context) ([]*podresourcesv1.PodResources, error) {
	// A missing socket must not turn into a wait: grpc dials lazily.
	if _, err := os.Stat(r.opts.PodResourcesSocket); err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("unix://"+r.opts.PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, r.opts.EvidenceTimeout)
	defer cancel()
	resp, err := podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("List on %s: %w", r.opts.PodResourcesSocket, err)
	}
	return resp.GetPodResources(), nil
}

// recordedPods looks up the pods the claim was reserved for at prepare:
// one that exists with the recorded UID on this node and has not ended
// may run a container with the claim's devices.
func (r *Releaser) recordedPods(ctx context.Context, c *checkpoint.PreparedClaim) error {
	for _, p := range c.Pods {
		pod, err := r.opts.Client.CoreV1().Pods(c.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return unknown("pods", fmt.Errorf("get Pod %s/%s: %w", c.Namespace, p.Name, err))
		case pod.UID != p.UID || pod.Spec.NodeName != r.opts.NodeName:
			continue
		case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
			continue
		}
		return held(HeldPod, "pod %s/%s (UID %s), which the claim was reserved for, is %s on this node", c.Namespace, p.Name, p.UID, phase(pod))
	}
	return nil
}

func phase(pod *corev1.Pod) string {
	if pod.DeletionTimestamp != nil {
		return "terminating"
	}
	return string(pod.Status.Phase)
}

// gpuProcesses is the last guard, for containers the API server and the
// kubelet no longer know (a force-deleted pod's): NVML's processes on the
// claim's devices. A device the claim shares with other prepared claims
// (MPS and time-slicing shares) also runs their processes: there a
// process holds the claim unless its cgroup names a pod recorded for one
// of the others and not for this one. A process in no pod (or unreadable)
// holds it.
func (r *Releaser) gpuProcesses(c *checkpoint.PreparedClaim, prepared []checkpoint.PreparedClaim) error {
	if r.opts.NVML == nil {
		return nil
	}
	for _, d := range c.Devices {
		for _, uuid := range d.UUIDs {
			pids, err := r.processes(uuid, d.Kind == vocabulary.KindMPS)
			if err != nil {
				return unknown("NVML", err)
			}
			others := otherPods(c.UID, uuid, prepared)
			for _, pid := range pids {
				if owner, ok := r.owner(pid); ok && others[owner] && !slices.ContainsFunc(c.Pods, func(p checkpoint.ReservedPod) bool { return p.UID == owner }) {
					continue
				}
				return held(HeldProcess, "process %d runs on %s (device %s)", pid, uuid, d.Device)
			}
		}
	}
	return nil
}

// otherPods are the pods recorded for the other prepared claims on device
// uuid; nil when no other claim uses it.
func otherPods(self types.UID, uuid string, prepared []checkpoint.PreparedClaim) map[types.UID]bool {
	var out map[types.UID]bool
	for _, o := range prepared {
		if o.UID == self || !slices.ContainsFunc(o.Devices, func(d checkpoint.PreparedDevice) bool { return slices.Contains(d.UUIDs, uuid) }) {
			continue
		}
		if out == nil {
			out = map[types.UID]bool{}
		}
		for _, p := range o.Pods {
			out[p.UID] = true
		}
	}
	return out
}

// processes lists the compute and MPS client processes on the GPU or MIG
// device uuid, as telemetry counts them (containers run no graphics). On a
// GPU, processes of its MIG devices are not counted (they are another
// claim's), and for an MPS share only MPS clients are: the MPS server, a
// compute process of the daemon pod, runs until the GPU's last share goes.
func (r *Releaser) processes(uuid string, mpsClientsOnly bool) ([]uint32, error) {
	dev, ret := r.opts.NVML.DeviceGetHandleByUUID(uuid)
	if ret == nvml.ERROR_NOT_FOUND {
		return nil, nil // a MIG device destroyed meanwhile runs nothing
	}
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("device %s: %w", uuid, ret)
	}
	var pids []uint32
	lists := []func() ([]nvml.ProcessInfo, nvml.Return){dev.GetComputeRunningProcesses, dev.GetMPSComputeRunningProcesses}
	if mpsClientsOnly {
		lists = lists[1:]
	}
	for _, list := range lists {
		infos, ret := list()
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("processes on %s: %w", uuid, ret)
		}
		for _, p := range infos {
			if strings.HasPrefix(uuid, "GPU-") && p.GpuInstanceId != noGPUInstance {
				continue
			}
			pids = append(pids, p.Pid)
		}
	}
	return pids, nil
}

// noGPUInstance is NVML's GPU instance ID of a process outside MIG.
const noGPUInstance = 0xFFFFFFFF

// owner reads the pod of process pid from its cgroup, afresh each time: a
// PID may be reused by another process.
func (r *Releaser) owner(pid uint32) (types.UID, bool) {
	data, err := os.ReadFile(filepath.Join(r.opts.ProcRoot, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return "", false
	}
	owner, err := podattribution.ParseCgroup(string(data))
	if err != nil || owner.PodUID == "" {
		return "", false
	}
	return owner.PodUID, true
}

// isHeld returns the reason and detail of a hold.
func isHeld(err error) (*heldError, bool) {
	var h *heldError
	return h, errors.As(err, &h)
}
