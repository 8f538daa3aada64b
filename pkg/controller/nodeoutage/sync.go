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
		c.judgeMassLapse(ctx, c.opts.Clock.Now())
		return 0, errors.Join(c.deleteRule(ctx, node, rule, "node deleted"), c.deleteLease(ctx, lease, "node deleted"))
	}
	if lease == nil {
		c.forget(node)
		c.judgeMassLapse(ctx, c.opts.Clock.Now())
		return 0, c.deleteRule(ctx, node, rule, "no heartbeat Lease")
	}
	now := c.opts.Clock.Now()
	unrenewed := now.Sub(c.observe(node, lease, rule, now))
	if left := c.opts.GracePeriod - unrenewed; left > 0 {
		c.holdBack(node, false)
		c.judgeMassLapse(ctx, now)
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
		c.judgeMassLapse(ctx, now)
		return 0, errors.Join(c.deleteRule(ctx, node, rule, "plugin gone from the node: no ResourceSlices"),
			c.deleteLease(ctx, lease, "plugin gone from the node: no ResourceSlices"))
	}
	effect, recheck := resourceapi.DeviceTaintEffectNoSchedule, time.Duration(0)
	if c.opts.NoExecuteAfter > 0 {
		if left := c.opts.NoExecuteAfter - unrenewed; left > 0 && (rule == nil || rule.Spec.Taint.Effect != resourceapi.DeviceTaintEffectNoExecute) {
			recheck = left + recheckMargin
		} else {
			// Once NoExecute, the taint stays so until a renewal: a restart,
			// which counts the lapse from one grace period ago, does not lower it.
			effect = resourceapi.DeviceTaintEffectNoExecute
		}
	}
	mass := c.judgeMassLapse(ctx, now)
	if mass.on {
		if effect == resourceapi.DeviceTaintEffectNoExecute || rule == nil && !c.opts.MassLapseTaint {
			c.heldBackEvent(nodeObj, mass)
		}
		if rule == nil && !c.opts.MassLapseTaint {
			return 0, nil // judged again when the mass lapse ends
		}
		effect, recheck = resourceapi.DeviceTaintEffectNoSchedule, 0
	} else {
		c.holdBack(node, false)
	}
	want := c.desired(node, lease, effect, mass)
	if rule != nil && madeFor(rule, renewalOf(lease), false) {
		// Never record an older renewal than the rule does (the cache
		// may be behind): it would be lifted once the cache catches up.
		for _, k := range []string{vocabulary.AnnotationOutageRenewTime, vocabulary.AnnotationOutageHolder} {
			want.Annotations[k] = rule.Annotations[k]
		}
	}
	if err := c.ensureRule(ctx, node, rule, want); err != nil {
		return 0, err
	}
	if rule == nil || rule.Spec.Taint.Effect != effect {
		c.event(nodeObj, corev1.EventTypeWarning, "GPUPluginNotServing", "Taint", "%s", want.Annotations[vocabulary.AnnotationDescription])
	}
	return recheck, nil
}

// observe returns since when (controller clock) node counts as unrenewed:
// when the Lease's current renewal was first seen. A controller that
// starts sees every Lease as just renewed, so it waits a full grace period
// before tainting, except where a rule was made for this very renewal (by
// this controller, a previous run or another leader): then nothing was
// renewed since, and the node counts as lapsed for a grace period already.
func (c *Controller) observe(node string, lease *coordinationv1.Lease, rule *resourceapi.DeviceTaintRule, now time.Time) time.Time {
	r := renewalOf(lease)
	c.mu.Lock()
	defer c.mu.Unlock()
	o, ok := c.seen[node]
	if !ok || o.renewal != r {
		o = observation{renewal: r, at: now}
	}
	if lapsed := now.Add(-c.opts.GracePeriod); rule != nil && o.at.After(lapsed) && madeFor(rule, r, !ok) {
		o.at = lapsed
	}
	c.seen[node] = o
	return o.at
}

// madeFor reports whether rule was made for renewal r or a later one of the
// same holder: no renewal happened since. A later one means the Lease in
// the cache is older than the rule (its watch is behind another leader's).
// Another holder is another plugin process: a renewal, whatever its node's
// clock says. A rule without the record predates it: it is trusted for the
// renewal first seen, and ensureRule records that.
func madeFor(rule *resourceapi.DeviceTaintRule, r renewal, firstSeen bool) bool {
	renewTime, recorded := rule.Annotations[vocabulary.AnnotationOutageRenewTime]
	if !recorded {
		return firstSeen
	}
	if rule.Annotations[vocabulary.AnnotationOutageHolder] != r.holder {
		return false
	}
	if renewTime == r.renewTime {
		return true
	}
	made, err := time.Parse(metav1.RFC3339Micro, renewTime)
	seen, serr := time.Parse(metav1.RFC3339Micro, r.renewTime)
	return err == nil && (r.renewTime == "" || serr == nil && made.After(seen))
}

// renewalOf is the Lease's last renewal, as a rule records it.
func renewalOf(lease *coordinationv1.Lease) renewal {
	r := renewal{holder: ptr.Deref(lease.Spec.HolderIdentity, "")}
	if lease.Spec.RenewTime != nil {
		r.renewTime = lease.Spec.RenewTime.UTC().Format(metav1.RFC3339Micro)
	}
	return r
}

func (c *Controller) forget(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.seen, node)
	delete(c.heldBack, node)
}

// desired is node's rule: the taint on every device of the driver in the
// node's pool, described for the operator, with the renewal it is for.
func (c *Controller) desired(node string, lease *coordinationv1.Lease, effect resourceapi.DeviceTaintEffect, mass massLapse) *resourceapi.DeviceTaintRule {
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
	if mass.on {
		desc += fmt.Sprintf(" Mass lapse (%s): the taint is not escalated to NoExecute (docs/operations.md, Mass lapse).", mass)
	}
	r := renewalOf(lease)
	return &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{
			Name:   vocabulary.OutageRuleName(node),
			Labels: map[string]string{vocabulary.LabelOutage: "true"},
			Annotations: map[string]string{vocabulary.AnnotationDescription: desc,
				vocabulary.AnnotationOutageRenewTime: r.renewTime, vocabulary.AnnotationOutageHolder: r.holder},
		},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(c.opts.DriverName), Pool: ptr.To(node)},
			Taint:          resourceapi.DeviceTaint{Key: vocabulary.OutageTaintKey, Value: vocabulary.OutageTaintValue, Effect: effect},
		},
	}
}

// ensureRule creates want, or updates cur when its selector, taint or
// record of the renewal differ (the API sets the taint's timeAdded on a
// new effect).
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
		t.Value == want.Spec.Taint.Value && t.Effect == want.Spec.Taint.Effect && cur.Labels[vocabulary.LabelOutage] == "true" && recorded(cur, want) {
		c.changed(node, "", true)
		return nil
	}
	upd := cur.DeepCopy()
	upd.Labels = want.Labels
	if upd.Annotations == nil {
		upd.Annotations = map[string]string{}
	}
	for k, v := range want.Annotations {
		upd.Annotations[k] = v
	}
	upd.Spec = want.Spec
	if _, err := rules.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update DeviceTaintRule %s: %w", cur.Name, err)
	}
	c.changed(node, "update", true)
	logger.Info("Plugin still not serving: updated the node's taint", "deviceTaintRule", klog.KObj(cur), "effect", want.Spec.Taint.Effect)
	return nil
}

// recorded reports whether cur records the renewal want is for.
func recorded(cur, want *resourceapi.DeviceTaintRule) bool {
	for _, k := range []string{vocabulary.AnnotationOutageRenewTime, vocabulary.AnnotationOutageHolder} {
		if v, ok := cur.Annotations[k]; !ok || v != want.Annotations[k] {
			return false
		}
	}
	return true
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
