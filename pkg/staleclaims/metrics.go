package staleclaims

import "k8s.io/component-base/metrics"

// Metrics are a Releaser's metrics.
type Metrics struct {
	released *metrics.CounterVec
	held     *metrics.GaugeVec
}

func newMetrics(nodeName string) *Metrics {
	return &Metrics{
		released: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: "gpu_dra", Subsystem: "plugin",
			Name:           "stale_claims_released_total",
			Help:           "Prepared ResourceClaims the plugin released because the kubelet never unprepared them, by reason (deleted, replaced, not_allocated, reallocated).",
			StabilityLevel: metrics.ALPHA, ConstLabels: map[string]string{"node": nodeName},
		}, []string{"reason"}),
		held: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Namespace: "gpu_dra", Subsystem: "plugin",
			Name:           "stale_claims_held",
			Help:           "Prepared ResourceClaims stale for the grace period that the plugin does not release because a container may still use them, by reason (kubelet_container, pod_running, gpu_process, unknown).",
			StabilityLevel: metrics.ALPHA, ConstLabels: map[string]string{"node": nodeName},
		}, []string{"reason"}),
	}
}

// Registerer is what the metrics register with (a metrics.KubeRegistry).
type Registerer interface {
	MustRegister(...metrics.Registerable)
}

// MustRegister registers the metrics with reg.
func (m *Metrics) MustRegister(reg Registerer) { reg.MustRegister(m.released, m.held) }

// countHeld sets the held gauge from the claims held back now.
func (r *Releaser) countHeld() {
	n := map[string]int{}
	for _, reason := range r.heldFor {
		n[reason]++
	}
	for _, reason := range heldReasons {
		r.metrics.held.WithLabelValues(reason).Set(float64(n[reason]))
	}
}
