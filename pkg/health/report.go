package health

import (
	"context"
	"fmt"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// DefaultReportTimeout is the HealthCheckTimeout of the reports sent to the
// kubelet (its own default); reports are re-sent every third of it.
const DefaultReportTimeout = 30 * time.Second

// Device is a published device whose health follows a GPU. The prepare
// engine lists them from the device model and its checkpoint.
type Device struct {
	// Pool and Name identify the device in the ResourceSlices.
	Pool string
	Name string
	// GPUUUID is the physical GPU the device is, or is carved from.
	GPUUUID string
	// MIG is the MIG instance the device is now: set for static MIG devices
	// and for prepared dynamic ones. Conditions of other MIG instances of
	// the GPU do not affect the device.
	MIG *MIGInstance
}

// Report builds a kubelet health report covering devices: Healthy,
// Unhealthy with the condition as message, or Unknown for devices whose
// GPU is not monitored. timeout is each device's HealthCheckTimeout.
func Report(snap Snapshot, devices []Device, timeout time.Duration, now time.Time) kubeletplugin.DeviceHealthReport {
	report := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, 0, len(devices))}
	for _, d := range devices {
		h := kubeletplugin.DeviceHealth{PoolName: d.Pool, DeviceName: d.Name, LastUpdated: now, HealthCheckTimeout: timeout}
		st, ok := snap[d.GPUUUID]
		switch c := st.ConditionFor(d.MIG); {
		case !ok:
			h.Health, h.Message = kubeletplugin.HealthStatusUnknown, "GPU "+d.GPUUUID+" is not monitored"
		case c != nil:
			h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, conditionMessage(c, st.Lost)
		default:
			h.Health = kubeletplugin.HealthStatusHealthy
			if st.EventsUnsupported {
				h.Message = "NVML cannot deliver error events for this GPU: only a lost GPU is detected"
			}
		}
		report.Devices = append(report.Devices, h)
	}
	return report
}

func conditionMessage(c *Condition, lost bool) string {
	msg := fmt.Sprintf("%s: %s, since %s", c.Reason, c.Message, c.Since.UTC().Format(time.RFC3339))
	if c.Events > 1 {
		msg += fmt.Sprintf(" (%d critical events, last at %s)", c.Events, c.LastEvent.UTC().Format(time.RFC3339))
	}
	switch {
	case c.Action != "":
		msg += "; NVML reports the GPU needs " + c.Action.describe()
	case lost:
		msg += "; the GPU needs a reset or reboot"
	}
	return msg
}

// WatchHealthStatus implements the body of kubeletplugin.DRAPlugin's
// WatchHealthStatus: it sends a report covering devices() at once, again
// after every health change, and every third of opts.ReportTimeout so the
// kubelet's lease never lapses, until ctx is canceled (then it returns nil).
// devices is called for every report, so MIG instances created or
// destroyed since are reflected.
func (m *Monitor) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport, devices func() []Device) error {
	timeout := m.opts.ReportTimeout
	ticker := m.clock.NewTicker(timeout / 3)
	defer ticker.Stop()
	sub := m.Subscribe(ctx)
	var snap Snapshot
	for {
		select {
		case <-ctx.Done():
			return nil
		case s, ok := <-sub:
			if !ok {
				return nil // canceled, or the monitor stopped
			}
			snap = s
		case <-ticker.C():
		}
		report := Report(snap, devices(), timeout, m.clock.Now())
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
	}
}
