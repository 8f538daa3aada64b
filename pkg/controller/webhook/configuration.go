package webhook

import (
	"fmt"

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
//
// Each webhook has one matchCondition: the API server calls it only for
// objects with an opaque config for driverName, the only ones the handler
// checks. So an outage of the controller under failurePolicy Fail refuses
// only our objects, not claims without config or with other drivers'
// configs. An UPDATE of a DeviceClass that drops our config is not sent
// either: it leaves nothing to validate. No rule names DELETE, where object
// is null.
//
// The last webhook sends ResourceQuotas (CREATE and UPDATE) whose spec.hard
// names a device plugin resource or one of quotaNames (QuotaNames filters
// them as the handler does) without the requests. prefix; the handler
// only warns about them. Its failurePolicy is always Ignore, whatever
// failurePolicy says: a warning is not worth refusing a quota for, and under
// Fail an outage of the controller would block creating namespaces' quotas
// that name our resources.
func Webhooks(driverName string, clientConfig admissionregistrationv1.WebhookClientConfig, failurePolicy admissionregistrationv1.FailurePolicyType, timeoutSeconds int32, quotaNames ...string) []admissionregistrationv1.ValidatingWebhook {
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
	common := func(name string, condition admissionregistrationv1.MatchCondition, rules ...admissionregistrationv1.RuleWithOperations) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{
			Name:                    name,
			ClientConfig:            clientConfig,
			Rules:                   rules,
			MatchConditions:         []admissionregistrationv1.MatchCondition{condition},
			FailurePolicy:           ptr.To(failurePolicy),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			TimeoutSeconds:          ptr.To(timeoutSeconds),
			AdmissionReviewVersions: []string{"v1"},
		}
	}
	quotas := common("resourcequotas."+driverName, admissionregistrationv1.MatchCondition{Name: quotaConditionName, Expression: quotaCondition(QuotaNames(quotaNames))},
		admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{quotasGVR.Group}, APIVersions: []string{quotasGVR.Version}, Resources: []string{quotasGVR.Resource},
				Scope: ptr.To(admissionregistrationv1.NamespacedScope),
			},
		})
	quotas.FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
	return []admissionregistrationv1.ValidatingWebhook{
		common("claims."+driverName, hasOurConfig(driverName, claimConfigs), rule([]string{"resourceclaims", "resourceclaimtemplates"}, admissionregistrationv1.Create)),
		common("deviceclasses."+driverName, hasOurConfig(driverName, classConfigs), rule([]string{"deviceclasses"}, admissionregistrationv1.Create, admissionregistrationv1.Update)),
		quotas,
	}
}

// The names of the matchConditions: that of the config webhooks and that of
// the quota webhook.
const (
	matchConditionName = "hasOpaqueConfigForDriver"
	quotaConditionName = "hardHasUnenforcedGPUName"
)

// CEL expressions for the DeviceConfigs of an object, as optional lists: the
// .? operator yields none where a field is absent, so objects without config
// evaluate to false instead of failing (an evaluation error would apply the
// failurePolicy). The claims webhook receives claims and templates.
const (
	claimConfigs = `(request.resource.resource == 'resourceclaimtemplates' ? object.?spec.?spec.?devices.?config : object.?spec.?devices.?config)`
	classConfigs = `object.?spec.?config`
)

// hasOurConfig is the matchCondition that is true when the optional list
// configs has an opaque config for driverName. Driver names are DNS
// subdomains, which need no escaping in a CEL string.
func hasOurConfig(driverName, configs string) admissionregistrationv1.MatchCondition {
	return admissionregistrationv1.MatchCondition{
		Name:       matchConditionName,
		Expression: fmt.Sprintf(`%s.orValue([]).exists(c, c.?opaque.?driver.orValue('') == '%s')`, configs, driverName),
	}
}
