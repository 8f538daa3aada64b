package prepare

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/opaqueconfig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// requestConfig picks the opaque configuration of this driver that applies
// to one allocation result. Class configs come before claim configs, and
// within each source a later entry overrides an earlier one, so the last
// match wins: a claim can refine what its class sets. Which requests a
// config applies to is vocabulary.AppliesTo's (subrequests included). Nil
// means no config applies.
func (d *Engine) requestConfig(claim *resourceapi.ResourceClaim, request string) (gpuv1beta1.Config, error) {
	var chosen gpuv1beta1.Config
	for _, source := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
		for i, c := range claim.Status.Allocation.Devices.Config {
			if c.Source != source || c.Opaque == nil || c.Opaque.Driver != d.opts.DriverName {
				continue
			}
			if !vocabulary.AppliesTo(c.Requests, request) {
				continue
			}
			cfg, err := opaqueconfig.DecodeDefaultValidate(c.Opaque.Parameters.Raw)
			if err != nil {
				return nil, fmt.Errorf("config %d (from %s) for request %q: %w", i, strings.ToLower(string(source)), request, err)
			}
			chosen = cfg
		}
	}
	return chosen, nil
}

// checkWholeGPUConfig accepts the configs a whole, exclusively used GPU
// supports. Shared use of a GPU is served by the sharing DeviceClasses, so
// the scheduler can account for it; a sharing strategy on a whole-GPU
// device would hide shares from it. NVIDIA's driver applies TimeSlicing
// and MPS to a whole GPU for the containers of its one claim; this driver
// refuses that rather than approximate it (docs/migration.md), and says
// what serves instead.
func checkWholeGPUConfig(cfg gpuv1beta1.Config, device string) error {
	switch c := cfg.(type) {
	case nil:
		return nil
	case *gpuv1beta1.GpuConfig:
		if c.Sharing != nil && c.Sharing.Strategy != gpuv1beta1.ExclusiveStrategy {
			return fmt.Errorf("device %s is a whole GPU allocated exclusively: sharing strategy %q is not supported for it: "+
				"the containers of its claim share it as CUDA does by default (time-slicing at the Default interval) without a config; "+
				"to share a GPU between claims, or under MPS, request a share from the DeviceClass timeslice.<driver name> or mps.<driver name>",
				device, c.Sharing.Strategy)
		}
		return nil
	default:
		return fmt.Errorf("device %s is a whole GPU: a %s does not apply to it, use %s", device, cfg.GetObjectKind().GroupVersionKind().Kind, gpuv1beta1.GpuConfigKind)
	}
}
