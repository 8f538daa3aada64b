// Package telemetry exposes the kubelet plugin's Prometheus metrics: per GPU
// and MIG device readings from NVML, labelled with the pods and claims that
// hold each device (Collector), and the driver's own counters and
// histograms, which the driver updates (DriverMetrics). Metrics use
// k8s.io/component-base/metrics; Handler serves them. See docs/telemetry.md.
package telemetry

import (
	"strconv"
	"sync"
	"time"

	"k8s.io/component-base/metrics"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const (
	namespace       = "gpu_dra"
	pluginSubsystem = "plugin"
)

// Results of a prepare or unprepare.
const (
	ResultSuccess = "success"
	ResultError   = "error"
)

// KindMixed is the kind of a claim whose devices are of different kinds.
const KindMixed = "mixed"

// Operations and reasons of DriverMetrics.Errors. The driver may use other
// short, bounded snake_case values.
const (
	OperationPrepare   = "prepare"
	OperationUnprepare = "unprepare"
	OperationPublish   = "publish"

	ReasonConfig     = "config"     // opaque config invalid or not applicable
	ReasonDevice     = "device"     // unknown device or pool in the allocation
	ReasonCheckpoint = "checkpoint" // checkpoint could not be saved
	ReasonCDI        = "cdi"        // CDI spec could not be written or removed
	ReasonMIG        = "mig"        // MIG instance or mode could not be changed
	ReasonSharing    = "sharing"    // time-slicing or MPS set-up failed
	ReasonNVML       = "nvml"       // other NVML failure
	ReasonOther      = "other"
)

// DriverMetrics are the driver's own metrics. An unregistered DriverMetrics
// is a valid no-op, so code paths need not check whether metrics are on.
type DriverMetrics struct {
	// PrepareDuration is the time to prepare one claim, by kind (gpu, mig,
	// timeslice, mps or mixed) and result (success, error).
	PrepareDuration *metrics.HistogramVec
	// UnprepareDuration is the time to unprepare one claim, by kind and
	// result.
	UnprepareDuration *metrics.HistogramVec
	// Errors counts failures by operation (prepare, unprepare, publish)
	// and reason (config, device, checkpoint, cdi, mig, sharing, nvml,
	// other).
	Errors *metrics.CounterVec
	// AllocatedDevices is the number of prepared devices by kind.
	AllocatedDevices *metrics.GaugeVec
	// MPSDaemons is the number of MPS control daemons the driver runs.
	MPSDaemons *metrics.Gauge
	// MIGInstances is the number of MIG instances the driver created and
	// holds for prepared claims.
	MIGInstances *metrics.Gauge
	// HealthEvents counts NVML health events by GPU, event type (xid, dbe,
	// gpu_lost), XID ("" for others) and whether the XID is ignored.
	HealthEvents *metrics.CounterVec

	mu         sync.Mutex
	kindsShown map[string]bool // kinds AllocatedDevices was ever set for
}

// NewDriverMetrics creates the driver's metrics, unregistered. nodeName,
// if not empty, is added as the constant label node, as the device metrics
// carry it, so dashboards can filter both by node alike.
func NewDriverMetrics(nodeName string) *DriverMetrics {
	latencyBuckets := metrics.ExponentialBuckets(0.001, 2, 16) // 1 ms … 33 s
	var node map[string]string
	if nodeName != "" {
		node = map[string]string{"node": nodeName}
	}
	return &DriverMetrics{
		PrepareDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Namespace: namespace, Subsystem: pluginSubsystem,
			Name:           "prepare_duration_seconds",
			Help:           "Time to prepare one ResourceClaim on the node, by device kind and result.",
			Buckets:        latencyBuckets,
			StabilityLevel: metrics.ALPHA, ConstLabels: node,
		}, []string{"kind", "result"}),
		UnprepareDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Namespace: namespace, Subsystem: pluginSubsystem,
			Name:           "unprepare_duration_seconds",
			Help:           "Time to unprepare one ResourceClaim on the node, by device kind and result.",
			Buckets:        latencyBuckets,
			StabilityLevel: metrics.ALPHA, ConstLabels: node,
		}, []string{"kind", "result"}),
		Errors: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: pluginSubsystem,
			Name:           "errors_total",
			Help:           "Failures of the kubelet plugin, by operation and reason.",
			StabilityLevel: metrics.ALPHA, ConstLabels: node,
		}, []string{"operation", "reason"}),
		AllocatedDevices: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Namespace: namespace, Subsystem: pluginSubsystem,
			Name:           "allocated_devices",
			Help:           "Devices of prepared claims on the node, by kind (gpu, mig, timeslice, mps).",
			StabilityLevel: metrics.ALPHA, ConstLabels: node,
		}, []string{"kind"}),
		MPSDaemons: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: namespace, Subsystem: pluginSubsystem,
			Name:           "mps_daemons",
			Help:           "MPS control daemons run by the driver (one per GPU with MPS shares).",
			StabilityLevel: metrics.ALPHA, ConstLabels: node,
		}),
		MIGInstances: metrics.NewGauge(&metrics.GaugeOpts{
			Namespace: namespace, Subsystem: pluginSubsystem,
			Name:           "mig_instances",
			Help:           "MIG instances the driver created and holds for prepared claims.",
			StabilityLevel: metrics.ALPHA, ConstLabels: node,
		}),
		HealthEvents: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace: namespace, Subsystem: "health",
			Name:           "events_total",
			Help:           "NVML health events by GPU UUID, event type (xid, dbe, gpu_lost), XID and whether the XID is ignored.",
			StabilityLevel: metrics.ALPHA, ConstLabels: node,
		}, []string{"uuid", "event", "xid", "ignored"}),
		kindsShown: map[string]bool{},
	}
}

// Registerer is what the metrics register with: a metrics.KubeRegistry, or
// legacyregistry through its MustRegister.
type Registerer interface {
	MustRegister(...metrics.Registerable)
}

// MustRegister registers every driver metric with r.
func (m *DriverMetrics) MustRegister(r Registerer) {
	r.MustRegister(m.PrepareDuration, m.UnprepareDuration, m.Errors,
		m.AllocatedDevices, m.MPSDaemons, m.MIGInstances, m.HealthEvents)
}

func result(err error) string {
	if err != nil {
		return ResultError
	}
	return ResultSuccess
}

// ObservePrepare records the preparation of one claim of kind that started
// at start and ended now with err.
func (m *DriverMetrics) ObservePrepare(kind string, start time.Time, err error) {
	m.PrepareDuration.WithLabelValues(kind, result(err)).Observe(time.Since(start).Seconds())
}

// ObserveUnprepare records the unpreparation of one claim.
func (m *DriverMetrics) ObserveUnprepare(kind string, start time.Time, err error) {
	m.UnprepareDuration.WithLabelValues(kind, result(err)).Observe(time.Since(start).Seconds())
}

// ObserveError counts a failure of operation for reason.
func (m *DriverMetrics) ObserveError(operation, reason string) {
	m.Errors.WithLabelValues(operation, reason).Inc()
}

// ObserveHealthEvent counts a health event; pass it as
// health.Options.OnEvent.
func (m *DriverMetrics) ObserveHealthEvent(e health.Event) {
	xid := ""
	if e.Type == health.EventXID {
		xid = strconv.FormatUint(e.XID, 10)
	}
	m.HealthEvents.WithLabelValues(e.GPUUUID, string(e.Type), xid, strconv.FormatBool(e.Ignored)).Inc()
}

// ClaimKind is the kind label of a claim: its devices' kind, or KindMixed.
func ClaimKind(c checkpoint.PreparedClaim) string {
	kind := ""
	for _, d := range c.Devices {
		switch {
		case kind == "":
			kind = d.Kind
		case kind != d.Kind:
			return KindMixed
		}
	}
	return kind
}

// UpdateFromCheckpoint sets the gauges from the prepared claims: allocated
// devices by kind (completed claims), MIG instances the driver created, and
// MPS daemons as the number of GPUs with MPS shares (each has one daemon).
// Call it after every checkpoint change, with the claims the checkpoint
// holds. A driver that counts its MPS daemons itself can set MPSDaemons
// after this call.
func (m *DriverMetrics) UpdateFromCheckpoint(claims []checkpoint.PreparedClaim) {
	byKind := map[string]int{}
	mpsGPUs := map[string]bool{}
	migInstances := 0
	for _, c := range claims {
		for _, d := range c.Devices {
			if c.State == checkpoint.PrepareCompleted {
				byKind[d.Kind]++
			}
			if d.MIG != nil && d.MIG.CreatedByDriver {
				migInstances++
			}
			if vocabulary.Kind(d.Kind) == vocabulary.KindMPS && d.GPUUUID != "" {
				mpsGPUs[d.GPUUUID] = true
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, k := range vocabulary.Kinds() {
		m.kindsShown[string(k)] = true
	}
	for k := range byKind {
		m.kindsShown[k] = true
	}
	for k := range m.kindsShown {
		m.AllocatedDevices.WithLabelValues(k).Set(float64(byKind[k]))
	}
	m.MIGInstances.Set(float64(migInstances))
	m.MPSDaemons.Set(float64(len(mpsGPUs)))
}
