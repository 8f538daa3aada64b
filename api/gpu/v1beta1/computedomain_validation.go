package v1beta1

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Default sets the unset fields of the domain's spec: allocation mode
// Single, lifetime WithOwner, and for AfterLastPod a grace period of
// DefaultGracePeriodSeconds. It leaves invalid values for Validate.
func (d *ComputeDomain) Default() {
	if d == nil {
		return
	}
	s := &d.Spec
	if s.Channel.AllocationMode == "" {
		s.Channel.AllocationMode = SingleChannel
	}
	if s.Lifetime == nil {
		s.Lifetime = &ComputeDomainLifetime{}
	}
	if s.Lifetime.Policy == "" {
		s.Lifetime.Policy = LifetimeWithOwner
	}
	if s.Lifetime.Policy == LifetimeAfterLastPod && s.Lifetime.GracePeriodSeconds == nil {
		grace := DefaultGracePeriodSeconds
		s.Lifetime.GracePeriodSeconds = &grace
	}
}

// Validate reports every invalid field of the domain's spec, with paths
// rooted at the object (spec.channel.resourceClaimName). It accepts
// a domain before and after Default. Metadata and status are the API
// server's and the controller's.
func (d *ComputeDomain) Validate() field.ErrorList {
	if d == nil {
		return nil
	}
	path := field.NewPath("spec")
	errs := d.Spec.Channel.validate(path.Child("channel"))
	return append(errs, d.Spec.Lifetime.validate(path.Child("lifetime"))...)
}

func (c *ComputeDomainChannel) validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	claim, tmpl := path.Child("resourceClaimName"), path.Child("resourceClaimTemplateName")
	switch {
	case c.ResourceClaimName == "" && c.ResourceClaimTemplateName == "":
		errs = append(errs, field.Required(claim, "or resourceClaimTemplateName: the ResourceClaim (shared) or ResourceClaimTemplate (a claim per pod) the controller creates for the domain's channel and its pods reference"))
	case c.ResourceClaimName != "" && c.ResourceClaimTemplateName != "":
		errs = append(errs, field.Forbidden(tmpl, "may not be set with resourceClaimName: a domain's pods use either one shared claim or a claim each"))
	}
	for _, f := range []struct {
		path *field.Path
		name string
	}{{claim, c.ResourceClaimName}, {tmpl, c.ResourceClaimTemplateName}} {
		if f.name == "" {
			continue
		}
		for _, msg := range validation.NameIsDNSSubdomain(f.name, false) {
			errs = append(errs, field.Invalid(f.path, f.name, msg))
		}
	}
	if c.AllocationMode != "" && !slices.Contains(channelAllocationModes, c.AllocationMode) {
		errs = append(errs, field.NotSupported(path.Child("allocationMode"), c.AllocationMode, channelAllocationModes))
	}
	return errs
}

func (l *ComputeDomainLifetime) validate(path *field.Path) field.ErrorList {
	if l == nil {
		return nil
	}
	var errs field.ErrorList
	if l.Policy != "" && !slices.Contains(lifetimePolicies, l.Policy) {
		errs = append(errs, field.NotSupported(path.Child("policy"), l.Policy, lifetimePolicies))
	}
	if g := l.GracePeriodSeconds; g != nil {
		switch {
		case l.Policy != LifetimeAfterLastPod:
			policy := l.Policy
			if policy == "" {
				policy = LifetimeWithOwner
			}
			errs = append(errs, field.Forbidden(path.Child("gracePeriodSeconds"),
				fmt.Sprintf("may only be set when policy is %q, not %q", LifetimeAfterLastPod, policy)))
		case *g < 0 || *g > MaxGracePeriodSeconds:
			errs = append(errs, field.Invalid(path.Child("gracePeriodSeconds"), *g,
				fmt.Sprintf("must be between 0 and %d", MaxGracePeriodSeconds)))
		}
	}
	return errs
}
