package allocatortest

import (
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
