package staleclaims

import "k8s.io/component-base/metrics"

// Metrics are a Releaser's metrics.
type Metrics struct {
	released *metrics.CounterVec
}

func newMetrics(nodeName string) *Metrics {
	return &Metrics{released: metrics.NewCounterVec(&metrics.CounterOpts{
		Namespace: "gpu_dra", Subsystem: "plugin",
		Name:           "stale_claims_released_total",
		Help:           "Prepared ResourceClaims the plugin released because the kubelet never unprepared them, by reason (deleted, replaced, not_allocated).",
		StabilityLevel: metrics.ALPHA, ConstLabels: map[string]string{"node": nodeName},
	}, []string{"reason"})}
}

// Registerer is what the metrics register with (a metrics.KubeRegistry).
type Registerer interface {
	MustRegister(...metrics.Registerable)
}

// MustRegister registers the metrics with reg.
func (m *Metrics) MustRegister(reg Registerer) { reg.MustRegister(m.released) }
