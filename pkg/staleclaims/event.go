package staleclaims

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// The reasons of the Node events a release and a hold record.
const (
	EventReason     = "StaleClaimReleased"
	HeldEventReason = "StaleClaimHeld"
)

// event records the release on the Node, since the claim is gone: in the
// default namespace and with the node's name as its UID, as the kubelet
// records node events, so `kubectl describe node` shows it. A failure is
// logged only: the release is done and the log and metric have it.
func (r *Releaser) event(ctx context.Context, c *checkpoint.PreparedClaim, reason string, devices []string) {
	r.nodeEvent(ctx, EventReason, fmt.Sprintf("Released ResourceClaim %s/%s (UID %s, %s) with devices %s: the kubelet never unprepared it",
		c.Namespace, c.Name, c.UID, strings.ReplaceAll(reason, "_", " "), strings.Join(devices, ", ")))
}

// hold keeps a stale claim prepared because a container may still use it:
// logged at every check, recorded on the Node when the reason changes.
func (r *Releaser) hold(ctx context.Context, c *checkpoint.PreparedClaim, reason string, h *heldError) {
	klog.FromContext(ctx).Info("Stale claim may still be in use; keeping it", "reason", reason, "heldBy", h.reason, "evidence", h.err.Error())
	if r.heldFor[c.UID] == h.reason {
		return
	}
	r.heldFor[c.UID] = h.reason
	r.nodeEvent(ctx, HeldEventReason, fmt.Sprintf("Keeping ResourceClaim %s/%s (UID %s, %s) with devices %s prepared: %s (%s)",
		c.Namespace, c.Name, c.UID, strings.ReplaceAll(reason, "_", " "), strings.Join(deviceNames(c), ", "), h.err, h.reason))
}

func (r *Releaser) nodeEvent(ctx context.Context, reason, message string) {
	now := metav1.NewTime(r.opts.Clock.Now())
	node := r.opts.NodeName
	ev := &corev1.Event{
		// Several releases in one check must not collide on a name.
		ObjectMeta:          metav1.ObjectMeta{GenerateName: node + ".", Namespace: metav1.NamespaceDefault},
		InvolvedObject:      corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node, UID: types.UID(node)},
		Reason:              reason,
		Message:             message,
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: r.opts.DriverName + "/kubelet-plugin", Host: node},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		ReportingController: r.opts.DriverName + "/kubelet-plugin",
		ReportingInstance:   node,
	}
	if _, err := r.opts.Client.CoreV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		klog.FromContext(ctx).Error(err, "Record on the node", "event", reason)
	}
}
