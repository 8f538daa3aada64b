package prepare

import (
	"context"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
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
func (d *Engine) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if d.opts.Health == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	return d.opts.Health.WatchHealthStatus(ctx, reports, d.HealthDevices)
}

// HealthDevices maps the published devices to their GPUs (and prepared MIG
// instances) for health reports and taints.
func (d *Engine) HealthDevices() []health.Device {
	return health.DevicesFromPublished(d.opts.PoolName, d.published, d.PreparedClaims())
}

// Holders implements telemetry.HolderSource.
func (d *Engine) Holders() map[string][]telemetry.Holder {
	return telemetry.HoldersFromClaims(d.PreparedClaims(), d.attribution.Consumers)
}

// attributePrepared records the pods of the claims a previous run
// prepared: the kubelet does not prepare them again while their pods run,
// so without this their device metrics would lose the pod and container
// labels after every plugin restart. Claims are read once each, retrying
// errors other than NotFound for about a minute.
func (d *Engine) attributePrepared(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, c := range d.PreparedClaims() {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		var claim *resourceapi.ResourceClaim
		err := wait.ExponentialBackoffWithContext(ctx, wait.Backoff{Duration: time.Second, Factor: 2, Steps: 6, Cap: 30 * time.Second},
			func(ctx context.Context) (bool, error) {
				var err error
				claim, err = d.opts.Claims.ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
				switch {
				case err == nil:
					return true, nil
				case apierrors.IsNotFound(err):
					return false, err
				default:
					logger.V(4).Info("Reading a prepared claim for its pods, will retry", "claim", klog.KRef(c.Namespace, c.Name), "err", err)
					return false, nil
				}
			})
		switch {
		case err != nil:
			logger.V(2).Info("Pods of a claim prepared before the restart stay unknown", "claim", klog.KRef(c.Namespace, c.Name), "err", err)
		case claim.UID != c.UID:
			// The claim was deleted and made again: not the prepared one.
		default:
			d.attribution.Record(ctx, claim)
		}
	}
}

// claimKind is the metrics kind of a prepared claim ("" if not prepared).
func (d *Engine) claimKind(uid types.UID) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.cp.Get(uid); ok {
		return telemetry.ClaimKind(*c)
	}
	return ""
}

// observe records one prepare or unprepare in the driver metrics.
func (d *Engine) observe(prepare bool, kind string, start time.Time, err error) {
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
