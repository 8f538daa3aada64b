package allocatortest

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Claim builds an unallocated claim in namespace "default".
func Claim(name string, requests ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests}},
	}
}

// WithConstraints adds constraints to a claim.
func WithConstraints(claim *resourceapi.ResourceClaim, constraints ...resourceapi.DeviceConstraint) *resourceapi.ResourceClaim {
	claim.Spec.Devices.Constraints = append(claim.Spec.Devices.Constraints, constraints...)
	return claim
}

// Exactly requests count devices of a class matching all CEL selectors.
func Exactly(name, class string, count int64, cel ...string) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount,
		Count: count, Selectors: selectors(cel),
	}}
}

// FirstAvailable requests the first sub-request that can be satisfied.
func FirstAvailable(name string, subs ...resourceapi.DeviceSubRequest) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, FirstAvailable: subs}
}

// Sub is one alternative of a FirstAvailable request.
func Sub(name, class string, count int64, cel ...string) resourceapi.DeviceSubRequest {
	return resourceapi.DeviceSubRequest{
		Name: name, DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount,
		Count: count, Selectors: selectors(cel),
	}
}

// MatchAttribute requires all devices of the claim to share an attribute value.
func MatchAttribute(attr resourceapi.FullyQualifiedName) resourceapi.DeviceConstraint {
	return resourceapi.DeviceConstraint{MatchAttribute: &attr}
}

func selectors(exprs []string) []resourceapi.DeviceSelector {
	var out []resourceapi.DeviceSelector
	for _, e := range exprs {
		out = append(out, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
	}
	return out
}

// Profile is the CEL selector of MIG devices of one profile (e.g. "1g.10gb").
func Profile(name string) string {
	return fmt.Sprintf(`device.attributes[%q].profile == %q`, vocabulary.DriverName, name)
}

// WithCapacity adds consumable-capacity requests (name → quantity) to an
// Exactly request.
func WithCapacity(r resourceapi.DeviceRequest, caps map[string]string) resourceapi.DeviceRequest {
	r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
	for k, v := range caps {
		r.Exactly.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
	}
	return r
}
