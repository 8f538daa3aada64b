package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// stallReport says why the pods of ns that are still unbound wait, so that
// a stall explains itself in the bench's output: the scheduler's queues (a
// pod parked as unschedulable that no event requeues waits for the 5-minute
// flush), the taints of the nodes nodeSelector selects (stand-in nodes
// whose Leases lapsed are tainted unreachable for good: the stall of
// docs/performance.md), the pods' PodScheduled reasons, grouped, their
// claims' state, and one waiting pod's events.
func (b *bench) stallReport(ctx context.Context, sched *scheduler, ns, nodeSelector string) string {
	var out strings.Builder
	if nodes, err := b.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: nodeSelector}); err != nil {
		fmt.Fprintf(&out, "    nodes: %v\n", err)
	} else {
		taints := map[string]int{}
		for _, n := range nodes.Items {
			for _, t := range n.Spec.Taints {
				taints[t.Key+":"+string(t.Effect)]++
			}
		}
		fmt.Fprintf(&out, "    %d nodes, tainted: %v\n", len(nodes.Items), taints)
	}
	if lines, err := sched.metrics(ctx, "scheduler_pending_pods{"); err != nil {
		fmt.Fprintf(&out, "    scheduler queues: %v\n", err)
	} else {
		fmt.Fprintf(&out, "    scheduler queues: %s\n", strings.Join(lines, "; "))
	}
	pods, err := b.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return out.String() + fmt.Sprintf("    pods: %v\n", err)
	}
	reasons := map[string]int{}
	var waiting []corev1.Pod
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" || p.DeletionTimestamp != nil {
			continue
		}
		waiting = append(waiting, p)
		reason := "no PodScheduled condition (never tried, or gated)"
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled {
				reason = fmt.Sprintf("%s: %.300s", c.Reason, c.Message)
			}
		}
		reasons[reason]++
	}
	fmt.Fprintf(&out, "    %d pods wait:\n", len(waiting))
	for _, r := range slices.Sorted(maps.Keys(reasons)) {
		fmt.Fprintf(&out, "      %d× %s\n", reasons[r], r)
	}
	claims, err := b.client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return out.String() + fmt.Sprintf("    claims: %v\n", err)
	}
	state := map[string]int{}
	for _, c := range claims.Items {
		switch {
		case c.DeletionTimestamp != nil:
			state["being deleted"]++
		case c.Status.Allocation == nil:
			state["unallocated"]++
		case len(c.Status.ReservedFor) == 0:
			state["allocated, reserved for no pod"]++
		default:
			state["allocated and reserved"]++
		}
	}
	fmt.Fprintf(&out, "    claims: %v\n", state)
	if len(waiting) > 0 {
		p := waiting[0]
		evs, _ := b.runner.PodEvents(ctx, ns, p.Name)
		fmt.Fprintf(&out, "    %s: claims %v; events %q\n", p.Name, claimNames(p), evs)
	}
	return out.String()
}

// claimNames are the pod's claims as its status names them ("none yet"
// while the claim controller has not made them from the templates).
func claimNames(p corev1.Pod) []string {
	var names []string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			names = append(names, *s.ResourceClaimName)
		}
	}
	if len(names) == 0 {
		return []string{"none yet"}
	}
	return names
}
