package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/nodeoutage"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// outageGrace is the controller's --outage-grace-period in TestOutage: short,
// so the test waits seconds, not the default 40s.
const outageGrace = 15 * time.Second

// pluginProcess is the PID of the node's kubelet plugin: containerd runs it
// as a process of this host.
func pluginProcess(t *testing.T, ctx context.Context) int {
	t.Helper()
	return pluginProcessOn(t, ctx, env.node)
}

// pluginProcessOn is the PID of node's kubelet plugin. On the local cluster
// every node's plugin is a process of this host: node's is the one in the
// node's cgroup tree (the kubelet's cgroupRoot /gdd-<node>, hack/cluster/node.sh).
func pluginProcessOn(t *testing.T, ctx context.Context, node string) int {
	t.Helper()
	var pids []int
	err := poll(ctx, func(context.Context) (bool, error) {
		pids = nil
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return false, err
		}
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil {
				continue
			}
			args := strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")
			if args[0] == "/usr/bin/dra-kubelet-plugin" && processState(pid) != "Z" && onNode(pid, node) {
				pids = append(pids, pid)
			}
		}
		return len(pids) == 1, nil // a plugin replaced by an upgrade may still be exiting
	})
	if err != nil {
		t.Fatalf("want one kubelet plugin process of node %s on this host, have %v: %v", node, pids, err)
	}
	return pids[0]
}

// onNode says whether process pid runs on node of the local cluster: in its
// cgroup tree. A cluster whose nodes have no cgroup trees of their own (one
// node on the host) has every process on its node.
func onNode(pid int, node string) bool {
	if len(env.nodes) < 2 {
		return true
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return err == nil && strings.Contains(string(cg), "/gdd-"+node+"/")
}

// processState is the state letter of /proc/<pid>/stat (R, S, T, Z, ...).
func processState(pid int) string {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// pid (comm) state ...: comm may hold spaces, the state follows its ')'.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return string(stat[i+2])
	}
	return ""
}

// TestOutage: a plugin that is registered but does not serve (its process
// stopped with SIGSTOP, as a hung NVML call or a deadlock leaves it) keeps its
// ResourceSlices, so without the outage taint the scheduler would send new
// GPU pods there to hang in ContainerCreating. Its heartbeat Lease lapses,
// dra-controller taints the node's devices (DeviceTaintRule), and a new GPU
// pod stays Pending, unscheduled; a GPU pod that ran before runs on
// untouched. Every dra-controller pod is deleted: the new leader keeps the
// rule (no renewal happened). SIGCONT: the plugin renews, the rule goes, the
// new pod runs.
//
// The liveness probe would restart a stopped plugin after its failure
// threshold (~30s with the chart's defaults), ending the outage on its own
// before this test could look at it: the test installs the plugin without
// probes (kubeletPlugin.probes.port=0; the heartbeat's checks run without
// them) and a grace period of 15s. The process is always resumed in the
// cleanup.
func TestOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	c := env.cluster.Client
	if ok, err := nodeoutage.Served(c); err != nil || !ok {
		t.Fatalf("the cluster does not serve resource.k8s.io/v1 DeviceTaintRules (%v): the local cluster is Kubernetes 1.37", err)
	}
	saveRelease(t, ctx)
	upgradeRelease(t, ctx, "--set", "kubeletPlugin.probes.port=0", "--set", "controller.outage.gracePeriod="+outageGrace.String())
	leaseName := vocabulary.HeartbeatLeaseName(env.node)
	waitRenewed(t, ctx, leaseName, time.Now())

	ns := newNamespace(t, ctx, "e2e-outage")
	claimTemplate(t, ctx, ns, "gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driverName})
	before := claimPod(t, ctx, ns, "before", "gpu")
	slicesBefore := sliceCount(t, ctx)

	pid := pluginProcess(t, ctx)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP the plugin (pid %d): %v", pid, err)
	}
	stopped := time.Now()
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) // never leave the plugin stopped
	// The signal is delivered asynchronously: the state turns T shortly after.
	if err := poll(ctx, func(context.Context) (bool, error) { return processState(pid) == "T", nil }); err != nil {
		t.Fatalf("plugin process %d in state %q after SIGSTOP, want T", pid, processState(pid))
	}
	// The last renewal before the stop: the grace period runs from there
	// (this machine is the node, so both times are on one clock).
	lastRenewal := waitRenewed(t, ctx, leaseName, time.Time{}).Spec.RenewTime.Time
	t.Logf("stopped the plugin, pid %d, %v after its last renewal", pid, stopped.Sub(lastRenewal).Round(time.Millisecond))

	rule := waitRule(t, ctx, true)
	t.Logf("tainted %v after SIGSTOP: %s=%s:%s; %s", time.Since(stopped).Round(time.Second),
		rule.Spec.Taint.Key, rule.Spec.Taint.Value, rule.Spec.Taint.Effect, rule.Annotations[vocabulary.AnnotationDescription])
	if took := time.Since(lastRenewal); took < outageGrace {
		t.Errorf("tainted %v after the last renewal, before the grace period %v", took, outageGrace)
	}
	if sel := rule.Spec.DeviceSelector; sel == nil || ptr.Deref(sel.Pool, "") != env.node || ptr.Deref(sel.Driver, "") != driverName ||
		rule.Spec.Taint.Effect != resourceapi.DeviceTaintEffectNoSchedule || rule.Spec.Taint.Key != vocabulary.OutageTaintKey {
		t.Errorf("rule %s: selector %+v, taint %+v", rule.Name, rule.Spec.DeviceSelector, rule.Spec.Taint)
	}
	if err := poll(ctx, func(ctx context.Context) (bool, error) { return nodeEvent(ctx, "GPUPluginNotServing") != "", nil }); err != nil {
		t.Errorf("no GPUPluginNotServing event on node %s: %v", env.node, err)
	}
	if n := sliceCount(t, ctx); n != slicesBefore {
		t.Errorf("the stopped plugin's node has %d ResourceSlices, had %d: the kubelet keeps a registered plugin's slices", n, slicesBefore)
	}

	// A new GPU pod stays Pending: its claim gets none of the tainted devices.
	if _, err := c.CoreV1().Pods(ns).Create(ctx, newClaimPod(ns, "after", "gpu"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var reason string
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		pod, err := c.CoreV1().Pods(ns).Get(ctx, "after", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				reason = cond.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the new GPU pod was not reported unschedulable while the node is tainted: %v", err)
	}
	t.Logf("new GPU pod unschedulable: %s", reason)
	if !strings.Contains(reason, "cannot allocate all claims") {
		t.Errorf("unschedulable for another reason: %s", reason)
	}
	time.Sleep(20 * time.Second) // it stays so: the scheduler retries
	if pod, err := c.CoreV1().Pods(ns).Get(ctx, "after", metav1.GetOptions{}); err != nil || pod.Spec.NodeName != "" || pod.Status.Phase != corev1.PodPending {
		t.Errorf("the new GPU pod was scheduled to the stopped plugin's node: %v, node %q, phase %s", err, pod.Spec.NodeName, pod.Status.Phase)
	}
	checkUntouched(t, ctx, before, "while the plugin is stopped")
	restartKeepsRule(t, ctx, rule)

	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT the plugin: %v", err)
	}
	resumed := time.Now()
	waitRule(t, ctx, false)
	t.Logf("rule deleted %v after SIGCONT", time.Since(resumed).Round(time.Second))
	if err := env.runner.WaitPodRunning(ctx, ns, "after"); err != nil {
		evs, _ := env.runner.PodEvents(ctx, ns, "after")
		t.Fatalf("the new GPU pod does not run after the plugin serves again: %v; events: %s", err, strings.Join(evs, "; "))
	}
	t.Logf("new GPU pod running %v after SIGCONT", time.Since(resumed).Round(time.Second))
	checkUntouched(t, ctx, before, "after the plugin resumed")
}

// waitRenewed waits until the node's heartbeat Lease is renewed after since.
func waitRenewed(t *testing.T, ctx context.Context, name string, since time.Time) *coordinationv1.Lease {
	t.Helper()
	var l *coordinationv1.Lease
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		var err error
		l, err = env.cluster.Client.CoordinationV1().Leases(env.namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		// The node's clock is this machine's: the comparison is fair here.
		return err == nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(since.Add(-time.Second)), err
	})
	if err != nil {
		t.Fatalf("heartbeat Lease %s/%s not renewed: %v (%+v)", env.namespace, name, err, l)
	}
	return l
}

// waitRule waits until the node's outage rule exists (or is gone).
func waitRule(t *testing.T, ctx context.Context, exists bool) *resourceapi.DeviceTaintRule {
	t.Helper()
	return waitRuleFor(t, ctx, env.node, exists)
}

// waitRuleFor waits until node's outage rule exists (or is gone).
func waitRuleFor(t *testing.T, ctx context.Context, node string, exists bool) *resourceapi.DeviceTaintRule {
	t.Helper()
	var rule *resourceapi.DeviceTaintRule
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		r, err := env.cluster.Client.ResourceV1().DeviceTaintRules().Get(ctx, vocabulary.OutageRuleName(node), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return !exists, nil
		}
		rule = r
		return err == nil && exists, err
	})
	if err != nil {
		t.Fatalf("DeviceTaintRule %s exists=%v: %v", vocabulary.OutageRuleName(node), exists, err)
	}
	return rule
}

func sliceCount(t *testing.T, ctx context.Context) int {
	t.Helper()
	slices, err := env.cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + driverName + "," + resourceapi.ResourceSliceSelectorNodeName + "=" + env.node,
	})
	if err != nil {
		t.Fatal(err)
	}
	return len(slices.Items)
}

// checkUntouched: the pod runs in the same, unrestarted containers.
func checkUntouched(t *testing.T, ctx context.Context, before *corev1.Pod, when string) {
	t.Helper()
	pod, err := env.cluster.Client.CoreV1().Pods(before.Namespace).Get(ctx, before.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s: pod %s: %v", when, before.Name, err)
	}
	if pod.UID != before.UID || pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil || containerIDs(pod) != containerIDs(before) {
		t.Errorf("%s: the GPU pod that ran before was touched: phase %s, deleting %v, containers %s (were %s)",
			when, pod.Status.Phase, pod.DeletionTimestamp != nil, containerIDs(pod), containerIDs(before))
	}
}

// TestHeartbeatLeaseWriteDenied: the plugin's service account may write only
// the heartbeat Lease of the node its credential names (ValidatingAdmissionPolicy),
// so a compromised node can neither renew another node's Lease to hide its
// outage nor take over the controller's leader election Lease.
func TestHeartbeatLeaseWriteDenied(t *testing.T) {
	ctx := testContext(t)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	lease := func(name string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: env.namespace},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("intruder"), RenewTime: ptr.To(metav1.NowMicro())}}
	}
	own := pluginClient(t, env.node).CoordinationV1().Leases(env.namespace)

	// Its own node's Lease: allowed (a dry-run update of the real one).
	cur, err := env.cluster.Client.CoordinationV1().Leases(env.namespace).Get(ctx, vocabulary.HeartbeatLeaseName(env.node), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the plugin's heartbeat Lease: %v", err)
	}
	if _, err := own.Update(ctx, cur, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("the plugin may not renew its own node's Lease: %v", err)
	}
	for name, tc := range map[string]struct {
		node, lease string
	}{
		"another node's Lease":     {env.node, vocabulary.HeartbeatLeaseName("other-node")},
		"the leader election":      {env.node, env.release + "-controller"},
		"a token bound to no node": {"", vocabulary.HeartbeatLeaseName(env.node)},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := pluginClient(t, tc.node).CoordinationV1().Leases(env.namespace).Create(ctx, lease(tc.lease), dryRun)
			if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
				t.Fatalf("create Lease %s as the plugin of node %q: %v, want denied", tc.lease, tc.node, err)
			}
			if !strings.Contains(err.Error(), "may only write its own heartbeat Lease") {
				t.Errorf("denied, but not by the heartbeat policy: %v", err)
			}
		})
	}
}

// nodeEvent is the note of the latest event with reason on the node ("" none).
func nodeEvent(ctx context.Context, reason string) string {
	evs, err := env.cluster.Client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + env.node + ",reason=" + reason,
	})
	if err != nil || len(evs.Items) == 0 {
		return ""
	}
	return evs.Items[len(evs.Items)-1].Message
}

// restartKeepsRule deletes every dra-controller pod while the plugin does not
// serve: the new leader finds the rule made for the Lease's last renewal and
// keeps it, the same object, and records no GPUPluginServing event.
func restartKeepsRule(t *testing.T, ctx context.Context, rule *resourceapi.DeviceTaintRule) {
	t.Helper()
	c := env.cluster.Client
	selector := "app.kubernetes.io/component=controller,app.kubernetes.io/instance=" + env.release
	pods, err := c.CoreV1().Pods(env.namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("no dra-controller pods (%s): %v", selector, err)
	}
	restarted := time.Now()
	for _, p := range pods.Items {
		if err := c.CoreV1().Pods(env.namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete dra-controller pod %s: %v", p.Name, err)
		}
	}
	waitController(t, ctx)
	// The new leader takes the election Lease (at most its duration, 15s),
	// syncs its caches and judges every node at once; a grace period more
	// lets a wrongly counted fresh Lease lapse again.
	time.Sleep(15*time.Second + outageGrace)
	after, err := c.ResourceV1().DeviceTaintRules().Get(ctx, rule.Name, metav1.GetOptions{})
	if err != nil || after.UID != rule.UID {
		t.Errorf("after a dra-controller restart the rule %s is not the one made before (%v): lifted and made again, or gone", rule.Name, err)
		return
	}
	evs, err := c.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + env.node + ",reason=GPUPluginServing",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		last := ev.LastTimestamp.Time
		if ev.Series != nil && ev.Series.LastObservedTime.After(last) {
			last = ev.Series.LastObservedTime.Time
		}
		if ev.EventTime.After(last) {
			last = ev.EventTime.Time
		}
		if last.After(restarted) {
			t.Errorf("GPUPluginServing after the restart, with the plugin still stopped: %s", ev.Message)
		}
	}
	t.Logf("dra-controller restarted: rule %s kept (%s=%s:%s, made for renewal %s)", rule.Name, after.Spec.Taint.Key, after.Spec.Taint.Value,
		after.Spec.Taint.Effect, after.Annotations[vocabulary.AnnotationOutageRenewTime])
}
