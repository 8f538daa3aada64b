package prepare

import (
	"context"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/podattribution"
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
	if d.health == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	return d.health.WatchHealthStatus(ctx, reports, d.HealthDevices)
}

// HealthDevices maps the published devices to their GPUs (and prepared MIG
// instances) for health reports and taints.
func (d *Engine) HealthDevices() []health.Device {
	return healthDevices(d.opts.PoolName, d.published, d.PreparedClaims())
}

// healthDevices lists the published devices of pool with the GPU each
// follows. prepared (the checkpoint's claims) tells which dynamic MIG
// device currently is which MIG instance; without it, dynamic MIG devices
// follow only GPU-wide conditions.
func healthDevices(pool string, published []devicemodel.Published, prepared []checkpoint.PreparedClaim) []health.Device {
	instances := map[string]health.MIGInstance{}
	for _, c := range prepared {
		for _, pd := range c.Devices {
			if pd.MIG != nil && pd.Pool == pool {
				instances[pd.Device] = health.MIGInstance{GPUInstance: pd.MIG.GIID, ComputeInstance: pd.MIG.CIID}
			}
		}
	}
	out := make([]health.Device, 0, len(published))
	for i := range published {
		p := &published[i]
		if p.GPU == nil {
			continue
		}
		hd := health.Device{Pool: pool, Name: p.Device.Name, GPUUUID: p.GPU.UUID}
		if p.StaticMIG != nil {
			hd.MIG = &health.MIGInstance{GPUInstance: p.StaticMIG.GIID, ComputeInstance: p.StaticMIG.CIID}
		} else if inst, ok := instances[hd.Name]; ok {
			hd.MIG = &inst
		}
		out = append(out, hd)
	}
	return out
}

// Holders implements telemetry.HolderSource.
func (d *Engine) Holders() map[string][]telemetry.Holder {
	return holdersFromClaims(d.PreparedClaims(), d.attribution.Consumers)
}

// ProcessOwners returns the pods and containers of the processes on the
// GPUs, from their cgroups, for the collector's per-container readings.
func (d *Engine) ProcessOwners() telemetry.ProcessOwners {
	return ProcessOwners(d.processes)
}

// ProcessOwners adapts podattribution.Processes to telemetry.ProcessOwners.
func ProcessOwners(p *podattribution.Processes) telemetry.ProcessOwners {
	return processOwners{p}
}

type processOwners struct{ p *podattribution.Processes }

func (o processOwners) Owner(pid uint32) (telemetry.ProcessOwner, bool) {
	owner, ok := o.p.Owner(pid)
	return telemetry.ProcessOwner{PodUID: string(owner.PodUID), ContainerID: owner.ContainerID}, ok
}

func (o processOwners) Keep(pids map[uint32]bool) { o.p.Keep(pids) }

// holdersFromClaims builds the holder map from the checkpoint's claims.
// consumers returns the pods and containers using a claim
// (podattribution.Attribution.Consumers); nil or an empty result yields one
// holder without a pod. A device gets one holder per container using it,
// and one without a container for a pod none of whose known containers
// uses it. Claims not completely prepared are skipped.
func holdersFromClaims(claims []checkpoint.PreparedClaim, consumers func(types.UID) []podattribution.Consumer) map[string][]telemetry.Holder {
	out := map[string][]telemetry.Holder{}
	for _, c := range claims {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		var users []podattribution.Consumer
		if consumers != nil {
			users = consumers(c.UID)
		}
		if len(users) == 0 {
			users = []podattribution.Consumer{{}}
		}
		for _, pd := range c.Devices {
			holders := deviceHolders(c, pd, users)
			for _, uuid := range pd.UUIDs {
				out[uuid] = append(out[uuid], holders...)
			}
		}
	}
	return out
}

// deviceHolders returns the holders of one device of claim c.
func deviceHolders(c checkpoint.PreparedClaim, pd checkpoint.PreparedDevice, users []podattribution.Consumer) []telemetry.Holder {
	// A share's memory limit is what its preparation recorded; a record
	// that cannot be read was refused at prepare, and a record of an older
	// release has none: the holder then has no limit.
	res, _ := shareResult(pd)
	holder := func(u podattribution.Consumer, container string, ids []string) telemetry.Holder {
		return telemetry.Holder{Device: pd.Device, Namespace: c.Namespace, Claim: c.Name, Pod: u.Pod, Container: container,
			PodUID: string(u.PodUID), ContainerIDs: ids, Shared: pd.Sharing != nil, MemoryLimitBytes: res.MemoryLimitBytes}
	}
	var out []telemetry.Holder
	covered := map[string]bool{}
	for _, u := range users {
		if u.Uses(pd.Request) {
			out = append(out, holder(u, u.Container, u.ContainerIDs))
			covered[u.Pod] = true
		}
	}
	// The pod holds the device through its claim even if none of its
	// containers uses it.
	for _, u := range users {
		if !covered[u.Pod] {
			out = append(out, holder(u, "", nil))
			covered[u.Pod] = true
		}
	}
	return out
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
		return kindOf(*c)
	}
	return ""
}

// kindOf is the kind label of a claim: its devices' kind, or
// telemetry.KindMixed.
func kindOf(c checkpoint.PreparedClaim) string {
	kind := ""
	for _, pd := range c.Devices {
		switch {
		case kind == "":
			kind = string(pd.Kind)
		case kind != string(pd.Kind):
			return telemetry.KindMixed
		}
	}
	return kind
}

// observe records one prepare or unprepare in the driver metrics and tells
// the publisher that what is prepared may have changed.
func (d *Engine) observe(prepare bool, kind string, start time.Time, err error) {
	select {
	case d.preparedChanged <- struct{}{}:
	default: // a signal is pending: the publisher reads the state when it takes it
	}
	m := d.opts.Metrics
	if m == nil {
		return
	}
	if prepare {
		m.ObservePrepare(kind, start, err)
	} else {
		m.ObserveUnprepare(kind, start, err)
	}
	m.SetAllocations(allocations(d.PreparedClaims()))
}

// allocations are the gauges' figures of the prepared claims: allocated
// devices by kind (completed claims; every kind the driver prepares is
// shown, 0 when none), MIG instances the driver created, and MPS daemons as
// the number of GPUs with MPS shares (each has one daemon).
func allocations(claims []checkpoint.PreparedClaim) telemetry.Allocations {
	a := telemetry.Allocations{Devices: map[string]int{}}
	for _, k := range vocabulary.Kinds() {
		a.Devices[string(k)] = 0
	}
	mpsGPUs := map[string]bool{}
	for _, c := range claims {
		for _, pd := range c.Devices {
			if c.State == checkpoint.PrepareCompleted {
				a.Devices[string(pd.Kind)]++
			}
			if pd.MIG != nil && pd.MIG.CreatedByDriver {
				a.MIGInstances++
			}
			if pd.Kind == vocabulary.KindMPS && !pd.AdminAccess && pd.GPUUUID != "" {
				mpsGPUs[pd.GPUUUID] = true
			}
		}
	}
	a.MPSDaemons = len(mpsGPUs)
	return a
}

// PreparedDevices implements publisher.Prepared: the devices of the node's
// pool that checkpointed claims hold, prepared or still being prepared.
// Admin access holds nothing, so it withdraws nothing.
func (d *Engine) PreparedDevices() map[string]bool {
	out := map[string]bool{}
	for _, c := range d.PreparedClaims() {
		for _, pd := range c.Devices {
			if pd.Pool == d.opts.PoolName && !pd.AdminAccess {
				out[pd.Device] = true
			}
		}
	}
	return out
}

// PreparedChanged implements publisher.Prepared: signaled after every
// prepare and unprepare (one pending signal stands for any number).
func (d *Engine) PreparedChanged() <-chan struct{} { return d.preparedChanged }

// SetHealth hands the engine the health source its WatchHealthStatus
// reports from (none: health is not supported). It is not an Option because
// the plugin builds the health monitor over the GPUs it discovers after
// New's recovery. Call it once, before the kubelet can reach the engine, as
// SetDevices.
func (d *Engine) SetHealth(h Health) {
	d.health = h
}
