package webhook

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/utils/ptr"
)

// Webhooks returns the webhooks of a ValidatingWebhookConfiguration that
// sends the handler what it validates, for the chart to render and for
// integration tests to create. clientConfig says how the API server reaches
// the controller (a Service with path Path, or a URL); its CA bundle is
// patched in by the self-managed TLS.
//
// ResourceClaims and ResourceClaimTemplates are sent on CREATE only: their
// spec cannot change afterwards, and sending their updates (finalizers,
// labels) would make removing a finalizer depend on the webhook under
// failurePolicy Fail. DeviceClasses are sent on CREATE and UPDATE. The
// rules name resource.k8s.io/v1; matchPolicy Equivalent has the API server
// convert requests made in other versions.
func Webhooks(driverName string, clientConfig admissionregistrationv1.WebhookClientConfig, failurePolicy admissionregistrationv1.FailurePolicyType, timeoutSeconds int32) []admissionregistrationv1.ValidatingWebhook {
	rule := func(resources []string, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.RuleWithOperations {
		return admissionregistrationv1.RuleWithOperations{
			Operations: ops,
			Rule: admissionregistrationv1.Rule{
				APIGroups:   []string{resourceGroup},
				APIVersions: []string{"v1"},
				Resources:   resources,
				Scope:       ptr.To(admissionregistrationv1.AllScopes),
			},
		}
	}
	common := func(name string, rules ...admissionregistrationv1.RuleWithOperations) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{
			Name:                    name,
			ClientConfig:            clientConfig,
			Rules:                   rules,
			FailurePolicy:           ptr.To(failurePolicy),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To(timeoutSeconds),
			AdmissionReviewVersions: []string{"v1"},
		}
	}
	return []admissionregistrationv1.ValidatingWebhook{
		common("claims."+driverName, rule([]string{"resourceclaims", "resourceclaimtemplates"}, admissionregistrationv1.Create)),
		common("deviceclasses."+driverName, rule([]string{"deviceclasses"}, admissionregistrationv1.Create, admissionregistrationv1.Update)),
	}
}
