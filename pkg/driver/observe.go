package driver

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry"
)

// Health reports device health to the kubelet.
type Health interface {
	WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport, devices func() []health.Device) error
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: the health
// monitor's view of every published device, including MIG devices by
// their instance.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if d.opts.Health == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	return d.opts.Health.WatchHealthStatus(ctx, reports, d.HealthDevices)
}

// HealthDevices maps the published devices to their GPUs (and prepared MIG
// instances) for health reports and taints.
func (d *Driver) HealthDevices() []health.Device {
	return health.DevicesFromPublished(d.opts.PoolName, d.published, d.PreparedClaims())
}

// Holders implements telemetry.HolderSource.
func (d *Driver) Holders() map[string][]telemetry.Holder {
	return telemetry.HoldersFromClaims(d.PreparedClaims(), d.attribution.Consumers)
}

// claimKind is the metrics kind of a prepared claim ("" if not prepared).
func (d *Driver) claimKind(uid types.UID) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.cp.Get(uid); ok {
		return telemetry.ClaimKind(*c)
	}
	return ""
}

// observe records one prepare or unprepare in the driver metrics.
func (d *Driver) observe(prepare bool, kind string, start time.Time, err error) {
	m := d.opts.Metrics
	if m == nil {
		return
	}
	if prepare {
		m.ObservePrepare(kind, start, err)
	} else {
		m.ObserveUnprepare(kind, start, err)
	}
	m.UpdateFromCheckpoint(d.PreparedClaims())
}
