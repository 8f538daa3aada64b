package kubeclient

import (
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
)

// Serves reports whether the API server serves resource in group version
// gv (e.g. "resource.k8s.io/v1", "devicetaintrules"); a group version it
// does not know is false, not an error.
func Serves(d discovery.DiscoveryInterface, gv, resource string) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(gv)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discover %s: %w", gv, err)
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return true, nil
		}
	}
	return false, nil
}
