// Package telemetry exposes the kubelet plugin's Prometheus metrics: per GPU
// and MIG device readings from NVML, labelled with the pods and claims that
// hold each device (Collector), and the driver's own counters and
// histograms, which the prepare engine updates (DriverMetrics). It measures
// and knows nothing of the checkpoint or the device model: the prepare engine
// hands it holders and allocation counts. Metrics use
// k8s.io/component-base/metrics; Handler serves them. See docs/telemetry.md.
package telemetry

import (
	"strconv"
	"sync"
	"time"

	"k8s.io/component-base/metrics"

	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
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
	kindsShown map[string]bool   // kinds AllocatedDevices was ever set for
	lastXID    map[string]uint64 // by GPU UUID, for LastXID
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
		lastXID:    map[string]uint64{},
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
		m.mu.Lock()
		m.lastXID[e.GPUUUID] = e.XID
		m.mu.Unlock()
	}
	m.HealthEvents.WithLabelValues(e.GPUUUID, string(e.Type), xid, strconv.FormatBool(e.Ignored)).Inc()
}

// LastXID implements XIDSource: the GPU's last XID event, ignored or not,
// since the plugin started.
func (m *DriverMetrics) LastXID(uuid string) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	xid, ok := m.lastXID[uuid]
	return xid, ok
}

// Allocations are the figures of the prepared claims that DriverMetrics
// shows as gauges.
type Allocations struct {
	// Devices counts the allocated devices of completely prepared claims
	// by kind. A kind with a zero count is shown as 0; a kind once shown
	// and now missing is shown as 0 too.
	Devices map[string]int
	// MIGInstances is the number of MIG instances the driver created.
	MIGInstances int
	// MPSDaemons is the number of MPS control daemons.
	MPSDaemons int
}

// SetAllocations sets the gauges; the prepare engine calls it after every
// checkpoint change.
func (m *DriverMetrics) SetAllocations(a Allocations) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range a.Devices {
		m.kindsShown[k] = true
	}
	for k := range m.kindsShown {
		m.AllocatedDevices.WithLabelValues(k).Set(float64(a.Devices[k]))
	}
	m.MIGInstances.Set(float64(a.MIGInstances))
	m.MPSDaemons.Set(float64(a.MPSDaemons))
}
