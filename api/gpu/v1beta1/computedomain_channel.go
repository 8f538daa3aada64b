package v1beta1

import (
	"k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ComputeDomainChannelConfigKind is the kind of ComputeDomainChannelConfig.
const ComputeDomainChannelConfigKind = "ComputeDomainChannelConfig"

// ComputeDomainChannelConfig is the opaque config of a compute domain's
// channel claim: it names the ComputeDomain, in the claim's namespace, whose
// IMEX daemon a node runs when it prepares the claim. The driver's controller
// writes it into the claim it creates for the domain
// (spec.channel.resourceClaimName); it applies only to IMEX channel devices.
//
// Example:
//
//	apiVersion: gpu.dra.dev/v1beta1
//	kind: ComputeDomainChannelConfig
//	domainName: training
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ComputeDomainChannelConfig struct {
	metav1.TypeMeta `json:",inline"`

	// DomainName names the ComputeDomain in the claim's namespace. A DNS
	// subdomain name; required.
	DomainName string `json:"domainName"`
}

func (*ComputeDomainChannelConfig) driverConfig() {}

var _ Config = &ComputeDomainChannelConfig{}

// Default does nothing: the config has no optional field.
func (c *ComputeDomainChannelConfig) Default() {}

// Validate reports a missing or malformed domainName.
func (c *ComputeDomainChannelConfig) Validate() field.ErrorList {
	if c == nil {
		return nil
	}
	path := field.NewPath("domainName")
	if c.DomainName == "" {
		return field.ErrorList{field.Required(path, "the ComputeDomain, in the claim's namespace, this channel belongs to")}
	}
	var errs field.ErrorList
	for _, msg := range validation.NameIsDNSSubdomain(c.DomainName, false) {
		errs = append(errs, field.Invalid(path, c.DomainName, msg))
	}
	return errs
}
