package scenarios

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// HealthNamespace is where the health scenario runs.
const HealthNamespace = "demo-health"

// HealthTaintKey is the device taint the plugin publishes for an unhealthy GPU.
const HealthTaintKey = "gpu.dra.dev/unhealthy"

// DefaultMetricsPort is the plugin's --metrics-address port, which also serves
// POST /simulate/event under --simulate.
const DefaultMetricsPort = 9400

// HealthResult is what the health scenario observed.
type HealthResult struct {
	Node string
	// GPU is the whole-GPU device (gpu-N) whose simulated GPU got the XID, Index its
	// NVML index, Share the time-slicing share device the victim pod holds.
	GPU, Share, UUID string
	Index            int
	XID              int
	// TaintAfter is how long after the injection the taint was seen in the slice.
	TaintAfter time.Duration
	// Taints are "device: key=value:effect" lines of the GPU's tainted devices.
	Taints []string
	// TaintedDevices counts the GPU's devices with the taint; Devices all of them.
	TaintedDevices, Devices int
	// ProbePending: a new claim for a share of that GPU (without a toleration)
	// stayed unallocated while the taint was there; ProbeEvents say why.
	ProbePending bool
	ProbeEvents  []string
	// PodStatus is the victim's allocatedResourcesStatus while unhealthy, PodStatusErr
	// why it did not show.
	PodStatus    []string
	PodStatusErr error
	// NodesWhileTainted is `kubectl gpu nodes` while the GPU was tainted.
	NodesWhileTainted string
	// RecoveredAfter is how long after the injection the taint went away.
	RecoveredAfter time.Duration
	// ProbeRanAfterRecovery: the probe pod got the GPU's share once the taint went.
	ProbeRanAfterRecovery bool
	// PodStatusAfter is the victim's allocatedResourcesStatus after recovery.
	PodStatusAfter []string
	// BystanderEvicted: the pod with a share of the GPU and no toleration was
	// evicted (NoExecute); VictimKept: the tolerating pod still runs at the end.
	BystanderEvicted, VictimKept bool
	// KubectlGPUProblems: where kubectl gpu disagreed with the claims while tainted.
	KubectlGPUProblems []string
	// Action is the recovery action the GPU's taint value names ("reset",
	// "drain-and-reset", "reboot"; empty: none). StillTaintedPastWindow: with
	// an action, the taint was still there recoverWithin after the event;
	// Performed is the /simulate/event query that then did the action.
	Action                 string
	StillTaintedPastWindow bool
	Performed              string
}

// Health runs the health scenario on node, printing what happens to w:
//
//  1. pod "victim" runs with a time-slicing share whose request tolerates the
//     unhealthy taint (so it stays to show its status; without the toleration the
//     device taint eviction controller evicts it on NoExecute);
//  2. XID xid is injected into that GPU through the plugin's /simulate/event (pod
//     proxy of the API server);
//  3. the taint appears on every device of the GPU in the ResourceSlice;
//  4. pod "probe", asking for a share of the same GPU without a toleration, stays
//     Pending;
//  5. the victim's status reports the device unhealthy (allocatedResourcesStatus);
//  6. after the plugin's --health-recovery-window the taint goes away and the probe
//     gets the share; unless the taint value names a recovery action the simulated
//     hardware asks for (XID79-reboot-required): then it is still there after
//     recoverWithin, the scenario performs the action (/simulate/event reset=true or
//     reboot=true), and the taint goes away.
//
// Hard failures (the cluster does not do a step at all) are returned as an error;
// the caller checks the result. CleanupHealth deletes the namespace.
func (r *Runner) Health(ctx context.Context, node string, xid int, recoverWithin time.Duration, w io.Writer) (*HealthResult, error) {
	res := &HealthResult{Node: node, XID: xid}
	say := func(format string, args ...any) { fmt.Fprintf(w, "  "+format+"\n", args...) }
	c := r.Cluster.Client
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: HealthNamespace}}, metav1.CreateOptions{}); err != nil {
		return res, err
	}
	if err := r.waitServiceAccount(ctx, HealthNamespace); err != nil {
		return res, err
	}
	// The device taint eviction controller honours only tolerations that name the
	// NoExecute effect; the second one lets the claim be allocated on a NoSchedule GPU.
	tolerate := []resourceapi.DeviceToleration{
		{Key: HealthTaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoExecute},
		{Key: HealthTaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule},
	}
	// Read before the victim's share is prepared: a prepared share withdraws
	// its GPU's whole-GPU device, which holds the NVML index.
	index, err := r.deviceIndex(ctx)
	if err != nil {
		return res, err
	}
	if err := r.healthPod(ctx, "victim", "", tolerate); err != nil {
		return res, err
	}
	if err := r.WaitPodRunning(ctx, HealthNamespace, "victim"); err != nil {
		return res, err
	}
	claim, err := c.ResourceV1().ResourceClaims(HealthNamespace).Get(ctx, "victim", metav1.GetOptions{})
	if err != nil {
		return res, err
	}
	devs := allocatedDevices(claim, index)
	if len(devs) != 1 {
		return res, fmt.Errorf("victim: want one allocated device, have %+v", devs)
	}
	d := devs[0]
	res.Share, res.UUID, res.GPU = d.Device, d.Attributes[vocabulary.AttrUUID], "gpu-"+d.GPU()
	// The NVML index is an attribute of the whole-GPU device.
	whole := index[d.Driver+"/"+d.Pool+"/"+res.GPU]
	if res.Index, err = strconv.Atoi(whole[vocabulary.AttrIndex]); err != nil {
		return res, fmt.Errorf("device %s/%s has no index attribute: %v", d.Pool, res.GPU, whole)
	}
	say("pod %s/victim runs on %s with %s (a time-slicing share of %s, UUID %s); its request tolerates %s", HealthNamespace, node, res.Share, res.GPU, res.UUID, HealthTaintKey)
	victim, err := c.CoreV1().Pods(HealthNamespace).Get(ctx, "victim", metav1.GetOptions{})
	if err != nil {
		return res, err
	}
	// A second pod on a share of the same GPU, without a toleration.
	sameGPU := fmt.Sprintf(`device.attributes["%s"].uuid == "%s"`, r.Driver, res.UUID)
	if err := r.healthPod(ctx, "bystander", sameGPU, nil); err != nil {
		return res, err
	}
	if err := r.WaitPodRunning(ctx, HealthNamespace, "bystander"); err != nil {
		return res, err
	}
	say("pod %s/bystander runs with another share of %s; its request has no toleration", HealthNamespace, res.GPU)

	say("injecting XID %d into the simulated GPU %d: POST /simulate/event?gpu=%d&xid=%d on the plugin", xid, res.Index, res.Index, xid)
	start := time.Now()
	if err := r.SimulateEvent(ctx, node, map[string]string{"gpu": strconv.Itoa(res.Index), "xid": strconv.Itoa(xid)}); err != nil {
		return res, err
	}
	err = r.poll(ctx, "taint "+HealthTaintKey+" on "+res.GPU, func(ctx context.Context) (bool, error) {
		taints, total, err := r.gpuTaints(ctx, node, d.GPU())
		if err != nil {
			return false, err
		}
		res.Devices = total
		// The victim's share is published (it is prepared); the GPU's other
		// devices that its shares make unallocatable are withdrawn.
		if len(taints[res.Share]) == 0 {
			return false, nil
		}
		res.TaintAfter = time.Since(start)
		res.TaintedDevices = len(taints)
		res.Taints = nil
		for _, dev := range sortedDeviceNames(taints) {
			for _, t := range taints[dev] {
				res.Taints = append(res.Taints, fmt.Sprintf("%s: %s=%s:%s", dev, t.Key, t.Value, t.Effect))
			}
		}
		return true, nil
	})
	if err != nil {
		return res, err
	}
	say("after %.1fs the ResourceSlice taints %d of the GPU's %d devices:", res.TaintAfter.Seconds(), res.TaintedDevices, res.Devices)
	for _, l := range res.Taints {
		if strings.HasPrefix(l, res.GPU+":") || strings.HasPrefix(l, res.Share+":") || strings.HasPrefix(l, res.GPU+"-mps:") {
			say("  %s", l)
		}
	}
	if len(res.Taints) > 3 {
		say("  ... and %d MIG placements of %s", len(res.Taints)-3, res.GPU)
	}

	// A new claim for a share of the same GPU, without a toleration.
	if err := r.healthPod(ctx, "probe", sameGPU, nil); err != nil {
		return res, err
	}
	probeCreated := time.Now()
	// The victim's pod status, while the probe has time to be refused. Bounded, so
	// the probe is looked at well before the recovery window ends.
	short := *r
	short.Timeout = 15 * time.Second
	err = short.poll(ctx, "allocatedResourcesStatus of victim", func(ctx context.Context) (bool, error) {
		lines, unhealthy, err := r.PodResourceHealth(ctx, HealthNamespace, "victim")
		res.PodStatus = lines
		return unhealthy, err
	})
	if err != nil {
		res.PodStatusErr = err
		say("pod status: no Unhealthy allocatedResourcesStatus (%v); have %v", err, res.PodStatus)
	} else {
		say("pod %s/victim status.containerStatuses[].allocatedResourcesStatus:", HealthNamespace)
		for _, l := range res.PodStatus {
			say("  %s", l)
		}
	}
	if err := r.sleep(ctx, time.Until(probeCreated.Add(r.Settle))); err != nil {
		return res, err
	}
	probe, err := c.CoreV1().Pods(HealthNamespace).Get(ctx, "probe", metav1.GetOptions{})
	if err != nil {
		return res, err
	}
	claim, err = c.ResourceV1().ResourceClaims(HealthNamespace).Get(ctx, "probe", metav1.GetOptions{})
	if err != nil {
		return res, err
	}
	res.ProbePending = probe.Status.Phase == corev1.PodPending && probe.Spec.NodeName == "" && claim.Status.Allocation == nil
	evs, _ := r.PodEvents(ctx, HealthNamespace, "probe")
	res.ProbeEvents = lastDistinct(evs, 1)
	say("pod %s/probe asks for a share of the same GPU without a toleration: %s, claim allocated: %v", HealthNamespace, probe.Status.Phase, claim.Status.Allocation != nil)
	for _, e := range res.ProbeEvents {
		say("  event: %s", oneLine(e, 200))
	}
	err = short.poll(ctx, "bystander evicted", func(ctx context.Context) (bool, error) {
		p, err := c.CoreV1().Pods(HealthNamespace).Get(ctx, "bystander", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && p.DeletionTimestamp != nil, err
	})
	res.BystanderEvicted = err == nil
	say("pod %s/bystander evicted by the device taint eviction controller (NoExecute, no toleration): %v", HealthNamespace, res.BystanderEvicted)
	if r.KubectlGPUPath != "" {
		if out, err := r.KubectlGPU(ctx, "nodes"); err == nil {
			res.NodesWhileTainted = out
			say("kubectl gpu nodes:")
			for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
				say("  %s", l)
			}
		} else {
			say("kubectl gpu nodes: %v", err)
		}
		res.KubectlGPUProblems, err = r.CheckKubectlGPU(ctx)
		if err != nil {
			res.KubectlGPUProblems = append(res.KubectlGPUProblems, err.Error())
		}
	}

	res.Action = taintAction(res.Taints)
	gone := func(ctx context.Context) (bool, error) {
		taints, _, err := r.gpuTaints(ctx, node, d.GPU())
		return len(taints) == 0, err
	}
	rr := *r
	rr.Timeout = recoverWithin
	if res.Action == "" {
		say("waiting for recovery (the plugin's --health-recovery-window after the last event)")
		if err := rr.poll(ctx, "taint "+HealthTaintKey+" removed from "+res.GPU, gone); err != nil {
			return res, err
		}
	} else {
		say("the taint names the recovery action NVML reports pending (%s): it must stay past the recovery window", res.Action)
		res.StillTaintedPastWindow = rr.poll(ctx, "taint "+HealthTaintKey+" removed from "+res.GPU, gone) != nil
		say("still tainted %.0fs after the event: %v", recoverWithin.Seconds(), res.StillTaintedPastWindow)
		q := map[string]string{"gpu": strconv.Itoa(res.Index), "reset": "true"}
		if res.Action == "reboot" {
			q = map[string]string{"reboot": "true"}
		}
		res.Performed = formatQuery(q)
		say("performing it on the simulated hardware: POST /simulate/event?%s", res.Performed)
		if err := r.SimulateEvent(ctx, node, q); err != nil {
			return res, fmt.Errorf("perform the recovery action: %w", err)
		}
		rr.Timeout = time.Minute
		if err := rr.poll(ctx, "taint "+HealthTaintKey+" removed from "+res.GPU+" after "+res.Action, gone); err != nil {
			return res, err
		}
	}
	res.RecoveredAfter = time.Since(start)
	say("after %.1fs the taint is gone from all devices of %s", res.RecoveredAfter.Seconds(), res.GPU)
	if err := r.WaitPodRunning(ctx, HealthNamespace, "probe"); err == nil {
		res.ProbeRanAfterRecovery = true
		say("pod %s/probe now runs with a share of %s", HealthNamespace, res.GPU)
	} else {
		say("pod %s/probe: %v", HealthNamespace, err)
	}
	short.Timeout = 30 * time.Second
	_ = short.poll(ctx, "allocatedResourcesStatus of victim healthy", func(ctx context.Context) (bool, error) {
		lines, unhealthy, err := r.PodResourceHealth(ctx, HealthNamespace, "victim")
		res.PodStatusAfter = lines
		return !unhealthy && len(lines) > 0, err
	})
	say("pod %s/victim allocatedResourcesStatus: %s", HealthNamespace, strings.Join(res.PodStatusAfter, "; "))
	after, err := c.CoreV1().Pods(HealthNamespace).Get(ctx, "victim", metav1.GetOptions{})
	res.VictimKept = err == nil && after.UID == victim.UID && after.DeletionTimestamp == nil && after.Status.Phase == corev1.PodRunning
	say("pod %s/victim, which tolerates the taint, still runs: %v", HealthNamespace, res.VictimKept)
	return res, nil
}

// Problems lists what the health scenario should have shown and did not.
func (h *HealthResult) Problems() []string {
	var out []string
	if len(h.Taints) == 0 {
		out = append(out, "no taint on the GPU")
	}
	if h.TaintedDevices < h.Devices {
		out = append(out, fmt.Sprintf("only %d of the %d published devices of %s tainted, want every one", h.TaintedDevices, h.Devices, h.GPU))
	}
	if !h.ProbePending {
		out = append(out, "a new claim for a share of the tainted GPU was allocated")
	}
	if h.PodStatusErr != nil {
		out = append(out, fmt.Sprintf("the pod status does not report the device unhealthy: %v (have %v)", h.PodStatusErr, h.PodStatus))
	}
	if !h.BystanderEvicted {
		out = append(out, "the pod without a toleration was not evicted")
	}
	if h.RecoveredAfter > 0 && !h.VictimKept {
		out = append(out, "the pod that tolerates the taint did not keep running")
	}
	out = append(out, h.KubectlGPUProblems...)
	if h.Action != "" && !h.StillTaintedPastWindow {
		out = append(out, "the taint naming recovery action "+h.Action+" was lifted before the action was done")
	}
	if h.RecoveredAfter == 0 {
		out = append(out, "the taint was not removed")
	}
	if h.RecoveredAfter > 0 && !h.ProbeRanAfterRecovery {
		out = append(out, "the probe pod did not get the GPU after recovery")
	}
	return out
}

// CleanupHealth deletes HealthNamespace.
func (r *Runner) CleanupHealth(ctx context.Context) error {
	return r.DeleteNamespaces(ctx, HealthNamespace)
}

// healthPod creates a claim and a pod of that name asking for a time-slicing share.
func (r *Runner) healthPod(ctx context.Context, name, selector string, tolerations []resourceapi.DeviceToleration) error {
	req := &resourceapi.ExactDeviceRequest{DeviceClassName: "timeslice." + r.Driver, Tolerations: tolerations}
	if selector != "" {
		req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}}
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: HealthNamespace},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}},
	}
	if _, err := r.Cluster.Client.ResourceV1().ResourceClaims(HealthNamespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		return err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: HealthNamespace},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
			Containers: []corev1.Container{{
				Name: "ctr", Image: "gdd.local/demo:v1", ImagePullPolicy: corev1.PullIfNotPresent,
				Command:   []string{"sleep", "86400"},
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
	_, err := r.Cluster.Client.CoreV1().Pods(HealthNamespace).Create(ctx, pod, metav1.CreateOptions{})
	return err
}

// PluginPod returns the running kubelet plugin pod on node.
func (r *Runner) PluginPod(ctx context.Context, node string) (*corev1.Pod, error) {
	pods, err := r.Cluster.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=kubelet-plugin",
		FieldSelector: "spec.nodeName=" + node,
	})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no running kubelet plugin pod on node %s", node)
}

// SimulateEvent POSTs /simulate/event with the query to the plugin on node
// (the plugin serves it on its metrics port under --simulate): gpu=N&xid=X,
// or gpu=N&lost=true|false.
func (r *Runner) SimulateEvent(ctx context.Context, node string, query map[string]string) error {
	q := url.Values{}
	for k, v := range query {
		q.Set(k, v)
	}
	_, err := r.pluginDo(ctx, node, http.MethodPost, "/simulate/event", q)
	return err
}

// gpuTaints returns the taints of our key on the devices of GPU minor on node, and
// how many devices the GPU has.
func (r *Runner) gpuTaints(ctx context.Context, node, minor string) (map[string][]resourceapi.DeviceTaint, int, error) {
	slices, err := r.Cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + r.Driver + ",spec.nodeName=" + node,
	})
	if err != nil {
		return nil, 0, err
	}
	out := map[string][]resourceapi.DeviceTaint{}
	total := 0
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			if (DeviceReport{Attributes: attributeStrings(r.Driver, d.Attributes)}).GPU() != minor {
				continue
			}
			total++
			for _, t := range d.Taints {
				if t.Key == HealthTaintKey {
					out[d.Name] = append(out[d.Name], t)
				}
			}
		}
	}
	return out, total, nil
}

// PodResourceHealth returns the pod's allocatedResourcesStatus as "container:
// resource id health (message)" lines, and whether any is Unhealthy.
func (r *Runner) PodResourceHealth(ctx context.Context, ns, name string) ([]string, bool, error) {
	pod, err := r.Cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, false, err
	}
	var lines []string
	unhealthy := false
	for _, cs := range pod.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			for _, h := range rs.Resources {
				l := fmt.Sprintf("%s: %s %s %s", cs.Name, rs.Name, h.ResourceID, h.Health)
				if h.Message != nil && *h.Message != "" {
					l += " (" + *h.Message + ")"
				}
				lines = append(lines, l)
				unhealthy = unhealthy || h.Health == corev1.ResourceHealthStatusUnhealthy
			}
		}
	}
	return lines, unhealthy, nil
}

func (r *Runner) sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func sortedDeviceNames(m map[string][]resourceapi.DeviceTaint) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// taintAction returns the recovery action a health taint value names
// ("<reason>-<action>-required", pkg/health.TaintValue) among taint lines
// "device: key=value:effect"; empty when none does.
func taintAction(lines []string) string {
	for _, l := range lines {
		_, kv, _ := strings.Cut(l, ": "+HealthTaintKey+"=")
		value, _, _ := strings.Cut(kv, ":")
		if rest, ok := strings.CutSuffix(value, "-required"); ok {
			if _, action, ok := strings.Cut(rest, "-"); ok {
				return action
			}
		}
	}
	return ""
}

// formatQuery formats q sorted by key, for the log.
func formatQuery(q map[string]string) string {
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + q[k]
	}
	return strings.Join(parts, "&")
}
