package nodeoutage

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// recheckMargin is added to the time left of a grace period, so the next
// look finds it over.
const recheckMargin = time.Second

// Sync reconciles node's rule with its heartbeat Lease, and cleans up after
// deleted nodes and removed plugins. It returns when to look again (0: on
// the next change).
func (c *Controller) Sync(ctx context.Context, node string) (time.Duration, error) {
	logger := klog.FromContext(ctx).WithValues("node", node)
	ctx = klog.NewContext(ctx, logger)
	lease := get[coordinationv1.Lease](c.leases, c.opts.Namespace+"/"+vocabulary.HeartbeatLeaseName(node))
	rule := get[resourceapi.DeviceTaintRule](c.rules, vocabulary.OutageRuleName(node))

	nodeObj := get[corev1.Node](c.nodes, node)
	if nodeObj == nil {
		c.forget(node)
		return 0, errors.Join(c.deleteRule(ctx, node, rule, "node deleted"), c.deleteLease(ctx, lease, "node deleted"))
	}
	if lease == nil {
		c.forget(node)
		return 0, c.deleteRule(ctx, node, rule, "no heartbeat Lease")
	}
	now := c.opts.Clock.Now()
	unrenewed := now.Sub(c.observe(node, lease, now))
	if left := c.opts.GracePeriod - unrenewed; left >= 0 {
		if err := c.deleteRule(ctx, node, rule, "plugin serves again"); err != nil {
			return 0, err
		}
		if rule != nil {
			c.event(nodeObj, corev1.EventTypeNormal, "GPUPluginServing", "Untaint", "The %s kubelet plugin renews its heartbeat Lease again: DeviceTaintRule %s deleted", c.opts.DriverName, rule.Name)
		}
		return left + recheckMargin, nil
	}
	if slices, err := c.slices.ByIndex(poolIndex, node); err == nil && len(slices) == 0 {
		// The kubelet deletes the slices of a plugin that unregistered:
		// the plugin was removed from the node (or is restarting, and then
		// creates its Lease again). Nothing is left to taint.
		c.forget(node)
		return 0, errors.Join(c.deleteRule(ctx, node, rule, "plugin gone from the node: no ResourceSlices"),
			c.deleteLease(ctx, lease, "plugin gone from the node: no ResourceSlices"))
	}
	effect, recheck := resourceapi.DeviceTaintEffectNoSchedule, time.Duration(0)
	if c.opts.NoExecuteAfter > 0 {
		if left := c.opts.NoExecuteAfter - unrenewed; left > 0 {
			recheck = left + recheckMargin
		} else {
			effect = resourceapi.DeviceTaintEffectNoExecute
		}
	}
	want := c.desired(node, lease, effect)
	if err := c.ensureRule(ctx, node, rule, want); err != nil {
		return 0, err
	}
	if rule == nil || rule.Spec.Taint.Effect != effect {
		c.event(nodeObj, corev1.EventTypeWarning, "GPUPluginNotServing", "Taint", "%s", want.Annotations[vocabulary.AnnotationDescription])
	}
	return recheck, nil
}

// observe returns when (controller clock) the Lease's current renewTime
// was first seen: on a change, now. A controller that starts sees every
// Lease as just renewed, so it waits a full grace period before tainting.
func (c *Controller) observe(node string, lease *coordinationv1.Lease, now time.Time) time.Time {
	var renewed time.Time
	if lease.Spec.RenewTime != nil {
		renewed = lease.Spec.RenewTime.Time
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	o, ok := c.seen[node]
	if !ok || !o.renewTime.Equal(renewed) {
		o = observation{renewTime: renewed, at: now}
		c.seen[node] = o
	}
	return o.at
}

func (c *Controller) forget(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.seen, node)
}

// desired is node's rule: the taint on every device of the driver in the
// node's pool, described for the operator.
func (c *Controller) desired(node string, lease *coordinationv1.Lease, effect resourceapi.DeviceTaintEffect) *resourceapi.DeviceTaintRule {
	last := "never"
	if lease.Spec.RenewTime != nil {
		last = lease.Spec.RenewTime.UTC().Format(time.RFC3339)
	}
	desc := fmt.Sprintf("The %s kubelet plugin on node %s has not renewed its heartbeat Lease %s/%s for more than %s (last renewal %s, holder %s): "+
		"it is registered but does not serve (its DRA socket or NVML does not answer, or the process is stopped). "+
		"New claims get none of the node's %s devices (taint %s=%s:%s) until it serves again; then this rule is deleted (docs/operations.md, Outage).",
		c.opts.DriverName, node, lease.Namespace, lease.Name, c.opts.GracePeriod, last, ptr.Deref(lease.Spec.HolderIdentity, "none"),
		c.opts.DriverName, vocabulary.OutageTaintKey, vocabulary.OutageTaintValue, effect)
	if effect == resourceapi.DeviceTaintEffectNoExecute {
		desc += fmt.Sprintf(" Unrenewed for more than %s: pods using its devices are evicted.", c.opts.NoExecuteAfter)
	}
	return &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{
			Name:        vocabulary.OutageRuleName(node),
			Labels:      map[string]string{vocabulary.LabelOutage: "true"},
			Annotations: map[string]string{vocabulary.AnnotationDescription: desc},
		},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(c.opts.DriverName), Pool: ptr.To(node)},
			Taint:          resourceapi.DeviceTaint{Key: vocabulary.OutageTaintKey, Value: vocabulary.OutageTaintValue, Effect: effect},
		},
	}
}

// ensureRule creates want, or updates cur when its selector or taint
// differ (the API sets the taint's timeAdded on a new effect).
func (c *Controller) ensureRule(ctx context.Context, node string, cur, want *resourceapi.DeviceTaintRule) error {
	logger := klog.FromContext(ctx)
	rules := c.client.ResourceV1().DeviceTaintRules()
	if cur == nil {
		if _, err := rules.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create DeviceTaintRule %s: %w", want.Name, err)
		}
		c.changed(node, "create", true)
		logger.Info("Plugin not serving: tainted the node's devices", "deviceTaintRule", klog.KObj(want),
			"effect", want.Spec.Taint.Effect, "description", want.Annotations[vocabulary.AnnotationDescription])
		return nil
	}
	t := cur.Spec.Taint
	if apiequality.Semantic.DeepEqual(cur.Spec.DeviceSelector, want.Spec.DeviceSelector) && t.Key == want.Spec.Taint.Key &&
		t.Value == want.Spec.Taint.Value && t.Effect == want.Spec.Taint.Effect && cur.Labels[vocabulary.LabelOutage] == "true" {
		c.changed(node, "", true)
		return nil
	}
	upd := cur.DeepCopy()
	upd.Labels = want.Labels
	if upd.Annotations == nil {
		upd.Annotations = map[string]string{}
	}
	upd.Annotations[vocabulary.AnnotationDescription] = want.Annotations[vocabulary.AnnotationDescription]
	upd.Spec = want.Spec
	if _, err := rules.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update DeviceTaintRule %s: %w", cur.Name, err)
	}
	c.changed(node, "update", true)
	logger.Info("Plugin still not serving: updated the node's taint", "deviceTaintRule", klog.KObj(cur), "effect", want.Spec.Taint.Effect)
	return nil
}

// deleteRule deletes node's rule, if it has one.
func (c *Controller) deleteRule(ctx context.Context, node string, rule *resourceapi.DeviceTaintRule, why string) error {
	if rule == nil {
		c.changed(node, "", false)
		return nil
	}
	err := c.client.ResourceV1().DeviceTaintRules().Delete(ctx, rule.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &rule.UID}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete DeviceTaintRule %s: %w", rule.Name, err)
	}
	c.changed(node, "delete", false)
	klog.FromContext(ctx).Info("Untainted the node's devices", "deviceTaintRule", klog.KObj(rule), "reason", why)
	return nil
}

// deleteLease deletes a Lease unless it changed since it was read.
func (c *Controller) deleteLease(ctx context.Context, lease *coordinationv1.Lease, why string) error {
	if lease == nil {
		return nil
	}
	err := c.client.CoordinationV1().Leases(lease.Namespace).Delete(ctx, lease.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &lease.UID, ResourceVersion: &lease.ResourceVersion}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Lease %s/%s: %w", lease.Namespace, lease.Name, err)
	}
	klog.FromContext(ctx).Info("Deleted the heartbeat Lease", "lease", klog.KObj(lease), "reason", why)
	return nil
}

// changed counts a write (action "" for none) and keeps the gauge of
// tainted nodes.
func (c *Controller) changed(node, action string, tainted bool) {
	if action != "" {
		c.metrics.OutageTaintChanges.WithLabelValues(action).Inc()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if tainted {
		c.tainted[node] = true
	} else {
		delete(c.tainted, node)
	}
	c.metrics.OutageTaintedNodes.Set(float64(len(c.tainted)))
}

// event records an event about the node, if there is a recorder.
func (c *Controller) event(node *corev1.Node, eventType, reason, action, note string, args ...any) {
	if c.opts.Recorder != nil {
		c.opts.Recorder.Eventf(node, nil, eventType, reason, action, note, args...)
	}
}
