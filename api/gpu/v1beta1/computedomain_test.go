package v1beta1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

func grace(s int32) *int32 { return &s }

func TestComputeDomainValidate(t *testing.T) {
	valid := func() *ComputeDomain {
		return &ComputeDomain{Spec: ComputeDomainSpec{Channel: ComputeDomainChannel{ResourceClaimName: "job-channel"}}}
	}
	for name, tc := range map[string]struct {
		mutate func(*ComputeDomain)
		want   []string // field paths and details of the errors, in order
	}{
		"minimal": {func(*ComputeDomain) {}, nil},
		"after last pod": {func(d *ComputeDomain) {
			d.Spec.Lifetime = &ComputeDomainLifetime{Policy: LifetimeAfterLastPod, GracePeriodSeconds: grace(0)}
		}, nil},
		"with owner": {func(d *ComputeDomain) { d.Spec.Lifetime = &ComputeDomainLifetime{Policy: LifetimeWithOwner} }, nil},
		"single":     {func(d *ComputeDomain) { d.Spec.Channel.AllocationMode = SingleChannel }, nil},
		"no claim":   {func(d *ComputeDomain) { d.Spec.Channel.ResourceClaimName = "" }, []string{"spec.channel.resourceClaimName: Required value: or resourceClaimTemplateName"}},
		"claim name": {func(d *ComputeDomain) { d.Spec.Channel.ResourceClaimName = "Job_Channel" }, []string{`spec.channel.resourceClaimName: Invalid value: "Job_Channel"`}},
		"template": {func(d *ComputeDomain) {
			d.Spec.Channel = ComputeDomainChannel{ResourceClaimTemplateName: "job-channel"}
		}, nil},
		"template name": {func(d *ComputeDomain) {
			d.Spec.Channel = ComputeDomainChannel{ResourceClaimTemplateName: "Job_Channel"}
		}, []string{`spec.channel.resourceClaimTemplateName: Invalid value: "Job_Channel"`}},
		"claim and template": {func(d *ComputeDomain) { d.Spec.Channel.ResourceClaimTemplateName = "job-channel" },
			[]string{"spec.channel.resourceClaimTemplateName: Forbidden: may not be set with resourceClaimName"}},
		"all channels":   {func(d *ComputeDomain) { d.Spec.Channel.AllocationMode = "All" }, []string{`spec.channel.allocationMode: Unsupported value: "All": supported values: "Single"`}},
		"policy":         {func(d *ComputeDomain) { d.Spec.Lifetime = &ComputeDomainLifetime{Policy: "Forever"} }, []string{`spec.lifetime.policy: Unsupported value: "Forever"`}},
		"grace w/o pods": {func(d *ComputeDomain) { d.Spec.Lifetime = &ComputeDomainLifetime{GracePeriodSeconds: grace(5)} }, []string{`spec.lifetime.gracePeriodSeconds: Forbidden: may only be set when policy is "AfterLastPod", not "WithOwner"`}},
		"grace too long": {func(d *ComputeDomain) {
			d.Spec.Lifetime = &ComputeDomainLifetime{Policy: LifetimeAfterLastPod, GracePeriodSeconds: grace(3601)}
		}, []string{"spec.lifetime.gracePeriodSeconds: Invalid value: 3601: must be between 0 and 3600"}},
		"grace negative": {func(d *ComputeDomain) {
			d.Spec.Lifetime = &ComputeDomainLifetime{Policy: LifetimeAfterLastPod, GracePeriodSeconds: grace(-1)}
		}, []string{"spec.lifetime.gracePeriodSeconds: Invalid value: -1"}},
		"every error": {func(d *ComputeDomain) {
			d.Spec.Channel = ComputeDomainChannel{AllocationMode: "Many"}
			d.Spec.Lifetime = &ComputeDomainLifetime{Policy: "Never"}
		}, []string{"spec.channel.resourceClaimName: Required", "spec.channel.allocationMode: Unsupported", "spec.lifetime.policy: Unsupported"}},
	} {
		t.Run(name, func(t *testing.T) {
			d := valid()
			tc.mutate(d)
			for _, defaulted := range []bool{false, true} {
				if defaulted {
					d.Default()
				}
				errs := d.Validate()
				if len(errs) != len(tc.want) {
					t.Fatalf("defaulted %v: Validate() = %v, want %d errors %q", defaulted, errs, len(tc.want), tc.want)
				}
				for i, err := range errs {
					if !strings.Contains(err.Error(), tc.want[i]) {
						t.Errorf("defaulted %v: error %d = %q, want %q", defaulted, i, err, tc.want[i])
					}
				}
			}
		})
	}
}

func TestComputeDomainDefault(t *testing.T) {
	d := &ComputeDomain{Spec: ComputeDomainSpec{Channel: ComputeDomainChannel{ResourceClaimName: "c"},
		Lifetime: &ComputeDomainLifetime{Policy: LifetimeAfterLastPod}}}
	d.Default()
	if d.Spec.Channel.AllocationMode != SingleChannel || *d.Spec.Lifetime.GracePeriodSeconds != DefaultGracePeriodSeconds {
		t.Errorf("defaulted spec %+v, lifetime %+v", d.Spec, *d.Spec.Lifetime)
	}
	owned := &ComputeDomain{}
	owned.Default()
	owned.Default() // idempotent
	if owned.Spec.Lifetime.Policy != LifetimeWithOwner || owned.Spec.Lifetime.GracePeriodSeconds != nil {
		t.Errorf("default lifetime %+v, want WithOwner without grace period", *owned.Spec.Lifetime)
	}
}

// A ComputeDomain is in the scheme (a client can read and write it) but is
// not an opaque config: Decode refuses it.
func TestComputeDomainScheme(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, obj := range []runtime.Object{&ComputeDomain{}, &ComputeDomainList{}} {
		gvks, _, err := scheme.ObjectKinds(obj)
		if err != nil || len(gvks) != 1 || gvks[0].GroupVersion() != GroupVersion {
			t.Errorf("%T: kinds %v, %v", obj, gvks, err)
		}
	}
	const doc = "apiVersion: gpu.dra.dev/v1beta1\nkind: ComputeDomain\nspec:\n  channel:\n    resourceClaimName: c\n"
	if _, err := Decode([]byte(doc)); err == nil {
		t.Error("Decode took a ComputeDomain for an opaque config")
	}
	var d ComputeDomain
	if err := yaml.UnmarshalStrict([]byte(doc), &d); err != nil || d.Spec.Channel.ResourceClaimName != "c" {
		t.Errorf("unmarshal: %v, %+v", err, d)
	}
	if c := d.DeepCopy(); c.Spec.Channel != d.Spec.Channel {
		t.Errorf("DeepCopy = %+v", c)
	}
}
