package computedomain

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// Condition types and reasons the controller writes (field manager
// FieldManager).
const (
	ConditionReady = "Ready"
	// ConditionPodsScheduled records that the channel claim has had pods:
	// True while it has some, False with ReasonNoPods since its last pod
	// went (lastTransitionTime), so that AfterLastPod deletion survives a
	// controller restart. Its time is only a lower bound of the grace
	// period's start (afterLastPod): status is writable by others.
	ConditionPodsScheduled = "PodsScheduled"

	ReasonConnected          = "Connected"
	ReasonNoNodes            = "NoNodes"
	ReasonDaemonStarting     = "DaemonStarting"
	ReasonDaemonDisconnected = "DaemonDisconnected"
	ReasonDaemonFailed       = "DaemonFailed"
	ReasonClaimConflict      = "ClaimConflict"
	ReasonNoFreeChannel      = "NoFreeChannel"
	ReasonInvalid            = "Invalid"

	ReasonPodsReserved = "PodsReserved"
	ReasonNoPods       = "NoPods"
	ReasonNeverHadPods = "NeverHadPods"
)

// FieldManager owns status.conditions.
const FieldManager = "dra-controller"

// readyCondition is the Ready condition for the domain's node entries:
// True iff there is at least one and every daemon is Connected; otherwise
// the worst state's reason, naming the nodes and what they cannot reach.
func readyCondition(nodes []gpuv1beta1.ComputeDomainNode) metav1.Condition {
	if len(nodes) == 0 {
		return notReady(ReasonNoNodes, "no node runs a pod of the domain yet")
	}
	byState := map[gpuv1beta1.DaemonState][]string{}
	for _, n := range nodes {
		desc := n.Name
		if len(n.Daemon.UnreachablePeers) > 0 {
			desc += " (cannot reach " + strings.Join(n.Daemon.UnreachablePeers, ", ") + ")"
		}
		if n.Daemon.Message != "" {
			desc += ": " + n.Daemon.Message
		}
		byState[n.Daemon.State] = append(byState[n.Daemon.State], desc)
	}
	for _, s := range []struct {
		state  gpuv1beta1.DaemonState
		reason string
	}{
		{gpuv1beta1.DaemonFailed, ReasonDaemonFailed},
		{gpuv1beta1.DaemonDisconnected, ReasonDaemonDisconnected},
		{gpuv1beta1.DaemonStarting, ReasonDaemonStarting},
		{"", ReasonDaemonStarting}, // an entry without a state yet
	} {
		if descs := byState[s.state]; len(descs) > 0 {
			slices.Sort(descs)
			return notReady(s.reason, fmt.Sprintf("IMEX daemon %s on %s", stateWord(s.state), strings.Join(descs, "; ")))
		}
	}
	if len(byState) > 1 || len(byState[gpuv1beta1.DaemonConnected]) == 0 { // an unknown state
		return notReady(ReasonDaemonStarting, "IMEX daemon state unknown on some nodes")
	}
	return metav1.Condition{Type: ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonConnected,
		Message: fmt.Sprintf("the IMEX daemons of all %d nodes are connected", len(nodes))}
}

func stateWord(s gpuv1beta1.DaemonState) string {
	if s == "" {
		return "not reported"
	}
	return strings.ToLower(string(s))
}

func notReady(reason, message string) metav1.Condition {
	return metav1.Condition{Type: ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: message}
}

// podsCondition is the PodsScheduled condition given the current one and
// whether the claim has pods now.
func podsCondition(cur *metav1.Condition, pods int) metav1.Condition {
	switch {
	case pods > 0:
		return metav1.Condition{Type: ConditionPodsScheduled, Status: metav1.ConditionTrue, Reason: ReasonPodsReserved,
			Message: fmt.Sprintf("%d pods reserve the channel claim", pods)}
	case cur != nil && (cur.Status == metav1.ConditionTrue || cur.Reason == ReasonNoPods):
		return metav1.Condition{Type: ConditionPodsScheduled, Status: metav1.ConditionFalse, Reason: ReasonNoPods,
			Message: "the channel claim's last pod is gone"}
	default:
		return metav1.Condition{Type: ConditionPodsScheduled, Status: metav1.ConditionFalse, Reason: ReasonNeverHadPods,
			Message: "no pod has reserved the channel claim yet"}
	}
}
