// Package publisher keeps the node's ResourceSlices published: the device
// model's resources, with the devices of unhealthy GPUs tainted, at start and
// again on every health change.
package publisher

import (
	"context"

	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
)

// Target publishes ResourceSlices; *kubeletplugin.Helper implements it.
type Target interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// HealthSource sends the GPUs' health at once and on every change;
// *health.Monitor implements it.
type HealthSource interface {
	Subscribe(ctx context.Context) <-chan health.Snapshot
}

// Options configure Run.
type Options struct {
	Target Target
	Health HealthSource
	// Resources are what the node publishes while every GPU is healthy.
	Resources resourceslice.DriverResources
	// Devices lists the published devices with the GPU (and MIG instance)
	// each follows; it is called for every publication, so MIG instances
	// prepared since are reflected.
	Devices func() []health.Device
	// Policy says which taint each condition gets.
	Policy health.TaintPolicy
}

// Run publishes opts.Resources with the taints of every health snapshot
// until ctx is canceled or the health source stops. A failed publication
// is logged; the next health change publishes again.
func Run(ctx context.Context, opts Options) {
	logger := klog.FromContext(ctx)
	for snap := range opts.Health.Subscribe(ctx) {
		res := health.TaintResources(opts.Resources, snap, opts.Devices(), opts.Policy)
		if err := opts.Target.PublishResources(ctx, res); err != nil && ctx.Err() == nil {
			logger.Error(err, "Publish ResourceSlices")
		}
	}
}
