package computedomain

import (
	"context"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/kubeclient"
)

// DefaultDiscoveryInterval is how often WaitForCRD asks again.
const DefaultDiscoveryInterval = time.Minute

// WaitForCRD returns true once the API server serves ComputeDomains, false
// when ctx ends first. Helm installs the chart's CRDs only with a new
// release, not on upgrade: until someone applies the CRD, the controller
// says so once and asks again every interval instead of failing the
// other controllers or retrying lists of an unknown resource.
func WaitForCRD(ctx context.Context, d discovery.DiscoveryInterface, interval time.Duration) bool {
	logger := klog.FromContext(ctx)
	gv, resource := gpuv1beta1.ComputeDomainResource.GroupVersion().String(), gpuv1beta1.ComputeDomainResource.Resource
	reported := false
	for {
		served, err := kubeclient.Serves(d, gv, resource)
		switch {
		case served:
			if reported {
				logger.Info("ComputeDomains are served now", "groupVersion", gv)
			}
			return true
		case err != nil:
			logger.Error(err, "Discover ComputeDomains; asking again", "every", interval)
		case !reported:
			logger.Error(nil, "ComputeDomains are off: the API server does not serve "+resource+"."+gv+
				" (apply deployments/crds/, which Helm does not do on upgrade); the controller checks again periodically", "every", interval)
			reported = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(interval):
		}
	}
}
