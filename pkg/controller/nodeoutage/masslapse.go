package nodeoutage

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// massLapse is a judgement over all nodes with a heartbeat Lease, as the
// node lifecycle controller judges a zone: when renewals stop on many nodes
// at once (the API server sheds the plugins' writes, a watch stalls, this
// controller's clock jumps), tainting them all NoExecute would evict every
// GPU pod of the cluster for a fault that is likely none of theirs.
type massLapse struct {
	on             bool
	lapsed, leases int
	threshold      float64
}

func (m massLapse) String() string {
	return fmt.Sprintf("%d of %d nodes with a heartbeat Lease lapsed, mass lapse threshold %v", m.lapsed, m.leases, m.threshold)
}

// judgeMassLapse counts the lapsed nodes among those observed. On a change
// of the judgement it says so loudly and queues every node, whose taint
// it changes.
func (c *Controller) judgeMassLapse(ctx context.Context, now time.Time) massLapse {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := massLapse{leases: len(c.seen), threshold: c.opts.MassLapseThreshold}
	for node, o := range c.seen {
		if now.Sub(o.at) < c.opts.GracePeriod {
			continue
		}
		// A renewal in the cache but not yet synced (queued behind this
		// node) is a renewal: the order of the queue must not make a mass
		// lapse.
		if l := get[coordinationv1.Lease](c.leases, c.opts.Namespace+"/"+vocabulary.HeartbeatLeaseName(node)); l != nil && renewalOf(l) == o.renewal {
			m.lapsed++
		}
	}
	m.on = m.lapsed >= c.opts.MassLapseMinNodes && float64(m.lapsed) >= c.opts.MassLapseThreshold*float64(m.leases)
	c.metrics.OutageLapsedNodes.Set(float64(m.lapsed))
	if m.on == c.massLapse {
		return m
	}
	c.massLapse = m.on
	logger := klog.FromContext(ctx)
	if m.on {
		c.metrics.OutageMassLapse.Set(1)
		logger.Error(nil, "Mass lapse: the heartbeats of too many nodes lapsed at once to blame their plugins; outage taints are not escalated to NoExecute until fewer are lapsed "+
			"(is the API server shedding the plugins' Lease writes, or this controller's watch stalled?)",
			"lapsed", m.lapsed, "leases", m.leases, "threshold", m.threshold, "minNodes", c.opts.MassLapseMinNodes, "taintNoSchedule", c.opts.MassLapseTaint)
	} else {
		c.metrics.OutageMassLapse.Set(0)
		logger.Info("Mass lapse over: outage taints escalate normally again", "lapsed", m.lapsed, "leases", m.leases, "threshold", m.threshold)
	}
	for node := range c.seen {
		c.queue.Add(node)
	}
	return m
}

// holdBack marks node as held back by a mass lapse, or not; it reports
// whether the node was not held back before.
func (c *Controller) holdBack(node string, held bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	was := c.heldBack[node]
	if held {
		c.heldBack[node] = true
	} else {
		delete(c.heldBack, node)
	}
	return held && !was
}

// heldBackEvent records, once per mass lapse, a Warning on the node whose
// taint the mass lapse holds back.
func (c *Controller) heldBackEvent(node *corev1.Node, m massLapse) {
	if !c.holdBack(node.Name, true) {
		return
	}
	what := "NoExecute"
	if !c.opts.MassLapseTaint {
		what = "at all"
	}
	c.event(node, corev1.EventTypeWarning, "GPUPluginMassLapse", "HoldBack", "The %s kubelet plugin has not renewed its heartbeat Lease for more than %s, nor have many others (%s): "+
		"suspecting the API server or dra-controller rather than every plugin, the node's devices are not tainted %s until fewer are lapsed (docs/operations.md, Mass lapse)",
		c.opts.DriverName, c.opts.GracePeriod, m, what)
}
