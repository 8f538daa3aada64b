// Package metrics defines the Prometheus metrics of the dra-controller
// (k8s.io/component-base/metrics). Each controller takes a *Metrics; an
// unregistered *Metrics is a valid no-op, so tests that do not look at
// metrics need not register it.
package metrics

import (
	"k8s.io/component-base/metrics"
)

const (
	namespace = "gpu_dra"
	subsystem = "controller"
)

// Rejection reasons of the admission webhook.
const (
	// ReasonInvalid: the config decoded but failed validation.
	ReasonInvalid = "invalid"
	// ReasonDecode: the config could not be decoded (unknown field or kind,
	// wrong type, not JSON, too large).
	ReasonDecode = "decode"
	// ReasonBadRequest: the AdmissionReview itself could not be read.
	ReasonBadRequest = "bad_request"
	// ReasonInternal: the mutating webhook could not do what the object
	// needs (an API call for a ResourceClaimTemplate failed).
	ReasonInternal = "internal"
)

// Node label write actions.
const (
	ActionSet    = "set"
	ActionRemove = "remove"
)

// Metrics are the controller's metrics.
type Metrics struct {
	// AdmissionDuration is the time to answer one AdmissionReview, by
	// resource (resourceclaims, resourceclaimtemplates, deviceclasses,
	// resourcequotas, unknown) and whether it was allowed.
	AdmissionDuration *metrics.HistogramVec
	// AdmissionRejections counts denied or unreadable admissions by resource
	// and reason (invalid, decode, bad_request).
	AdmissionRejections *metrics.CounterVec
	// RequestTranslations counts objects whose device plugin requests the
	// mutating webhook translated into ResourceClaims (or to which it
	// added the gang guard), by resource (pods, jobs).
	RequestTranslations *metrics.CounterVec
	// RequestTranslationTemplates counts the ResourceClaimTemplates it
	// created.
	RequestTranslationTemplates *metrics.Counter
	// NodeLabelsWritten counts node labels set or removed.
	NodeLabelsWritten *metrics.CounterVec
	// NodeLabelErrors counts failed node label reconciles.
	NodeLabelErrors *metrics.Counter
	// ModelClassChanges counts per-model DeviceClasses created, updated
	// and deleted.
	ModelClassChanges *metrics.CounterVec
	// ServingCertExpiry is the Unix time at which the webhook's serving
	// certificate expires.
	ServingCertExpiry *metrics.Gauge
	// CertRotations counts generated certificates by kind (ca, serving).
	CertRotations *metrics.CounterVec
	// OutageTaintsAvailable is 1 when the API server serves
	// DeviceTaintRules (outage taints work), 0 when it does not.
	OutageTaintsAvailable *metrics.Gauge
	// OutageTaintedNodes is the number of nodes whose devices are tainted
	// because their plugin does not serve.
	OutageTaintedNodes *metrics.Gauge
	// OutageTaintChanges counts outage DeviceTaintRules created, updated
	// and deleted.
	OutageTaintChanges *metrics.CounterVec
	// OutageMassLapse is 1 while so many nodes' heartbeats lapsed at once
	// that the controller holds escalation back (no NoExecute), else 0.
	OutageMassLapse *metrics.Gauge
	// OutageLapsedNodes is the number of nodes whose heartbeat Lease is
	// lapsed, tainted or held back.
	OutageLapsedNodes *metrics.Gauge
}

// New creates the metrics, unregistered.
func New() *Metrics {
	return &Metrics{
		AdmissionDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "admission_duration_seconds",
			Help:           "Time to answer an AdmissionReview, by resource and outcome.",
			Buckets:        metrics.ExponentialBuckets(0.0001, 2, 16), // 100µs … 3.3s
			StabilityLevel: metrics.ALPHA,
		}, []string{"resource", "allowed"}),
		AdmissionRejections: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "admission_rejections_total",
			Help:           "Admissions denied (invalid, decode, internal) or unreadable (bad_request), by resource and reason.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"resource", "reason"}),
		RequestTranslations: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "request_translations_total",
			Help:           "Objects whose device plugin requests were translated into ResourceClaims (or given the Volcano gang guard) at admission, by resource (pods, jobs).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"resource"}),
		RequestTranslationTemplates: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "request_translation_templates_created_total",
			Help:           "ResourceClaimTemplates created by the request translation.",
			StabilityLevel: metrics.ALPHA,
		}),
		NodeLabelsWritten: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "node_labels_written_total",
			Help:           "Node labels set or removed by the node label controller, by action.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"action"}),
		NodeLabelErrors: metrics.NewCounter(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "node_label_errors_total",
			Help:           "Failed node label reconciles (retried with backoff).",
			StabilityLevel: metrics.ALPHA,
		}),
		ModelClassChanges: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "model_deviceclass_changes_total",
			Help:           "Per-model DeviceClasses created, updated or deleted, by action.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"action"}),
		ServingCertExpiry: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "webhook_serving_cert_expiry_timestamp_seconds",
			Help:           "Unix time at which the webhook's current serving certificate expires.",
			StabilityLevel: metrics.ALPHA,
		}),
		CertRotations: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "webhook_certificates_generated_total",
			Help:           "Certificates generated by the self-managed TLS, by kind (ca, serving).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"kind"}),
		OutageTaintsAvailable: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "outage_taints_available",
			Help:           "1 when the API server serves DeviceTaintRules, so nodes whose plugin does not serve get tainted; 0 when it does not.",
			StabilityLevel: metrics.ALPHA,
		}),
		OutageTaintedNodes: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "outage_tainted_nodes",
			Help:           "Nodes whose devices are tainted because their kubelet plugin stopped renewing its heartbeat Lease.",
			StabilityLevel: metrics.ALPHA,
		}),
		OutageTaintChanges: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "outage_taint_rule_changes_total",
			Help:           "Outage DeviceTaintRules created, updated or deleted, by action.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"action"}),
		OutageMassLapse: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "outage_mass_lapse",
			Help:           "1 while the share of nodes with a lapsed heartbeat Lease is at or over the mass lapse threshold: no NoExecute outage taints, and no new taints at all unless configured.",
			StabilityLevel: metrics.ALPHA,
		}),
		OutageLapsedNodes: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: namespace, Subsystem: subsystem,
			Name:           "outage_lapsed_nodes",
			Help:           "Nodes whose kubelet plugin's heartbeat Lease has gone unrenewed for the grace period, tainted or held back.",
			StabilityLevel: metrics.ALPHA,
		}),
	}
}

// Registerer is what the metrics register with: a metrics.KubeRegistry,
// or legacyregistry through its MustRegister.
type Registerer interface {
	MustRegister(...metrics.Registerable)
}

// MustRegister registers every metric with r.
func (m *Metrics) MustRegister(r Registerer) {
	r.MustRegister(
		m.AdmissionDuration, m.AdmissionRejections,
		m.RequestTranslations, m.RequestTranslationTemplates,
		m.NodeLabelsWritten, m.NodeLabelErrors,
		m.ModelClassChanges,
		m.ServingCertExpiry, m.CertRotations,
		m.OutageTaintsAvailable, m.OutageTaintedNodes, m.OutageTaintChanges, m.OutageMassLapse, m.OutageLapsedNodes,
	)
}

// OrNew returns m, or unregistered (no-op) metrics when m is nil.
func OrNew(m *Metrics) *Metrics {
	if m == nil {
		return New()
	}
	return m
}
