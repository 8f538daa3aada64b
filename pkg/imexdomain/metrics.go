package imexdomain

import (
	"k8s.io/component-base/metrics"
)

// Metrics are the node's IMEX metrics.
type Metrics struct {
	// Peers counts this node's daemon's peers by state (connected,
	// unreachable), per domain (namespace/name).
	Peers *metrics.GaugeVec
}

func newMetrics(node string) *Metrics {
	return &Metrics{Peers: metrics.NewGaugeVec(&metrics.GaugeOpts{
		Namespace: "gpu_dra", Subsystem: "imex",
		Name:           "daemon_peers",
		Help:           "Peers of this node's IMEX daemon by compute domain (namespace/name) and state: connected, or unreachable (never connected or lost).",
		StabilityLevel: metrics.ALPHA, ConstLabels: metrics.Labels{"node": node},
	}, []string{"domain", "state"})}
}

// Registerer is what the metrics register with (telemetry.Registerer).
type Registerer interface {
	MustRegister(...metrics.Registerable)
}

// MustRegister registers the metrics with r.
func (m *Metrics) MustRegister(r Registerer) { r.MustRegister(m.Peers) }

func (m *Metrics) set(d Domain, connected, unreachable int) {
	m.Peers.WithLabelValues(d.Namespace+"/"+d.Name, "connected").Set(float64(connected))
	m.Peers.WithLabelValues(d.Namespace+"/"+d.Name, "unreachable").Set(float64(unreachable))
}

func (m *Metrics) forget(d Domain) {
	for _, s := range []string{"connected", "unreachable"} {
		m.Peers.DeleteLabelValues(d.Namespace+"/"+d.Name, s)
	}
}
