package webhook

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/utils/ptr"
)

// MutatingWebhooks returns the webhooks of the MutatingWebhookConfiguration
// that sends the Mutator what it translates, for the chart to render
// (deployments/helm/gpu-dra-driver/templates/controller.yaml keeps the same
// in step, test/chart checks it) and for integration tests to create. No
// schedulers: no webhooks (translation off).
//
// Pods (core v1) and Volcano Jobs (batch.volcano.sh/v1alpha1; a rule for an
// API that is not served is allowed and matches nothing) are sent on CREATE
// only: the fields translated cannot change afterwards. Their
// matchConditions send only objects of the listed schedulers (for a Job's
// task: the template's schedulerName, else the Job's) that have a
// domain-qualified resource name in some container's limits or requests (a
// superset of the extended resource names, which the handler maps exactly)
// or pod-level resourceClaims (the gang guard, and re-creating templates of
// an earlier translation). So an outage of the controller under
// failurePolicy Fail refuses only those.
//
// Volcano Queues (scheduling.volcano.sh/v1beta1, cluster-scoped) are sent
// on CREATE and UPDATE, all of them (a Queue has no scheduler), when
// spec.capability, spec.deserved or spec.guarantee.resource has a
// domain-qualified key (nvidia.com/gpu, or a deviceclass/ key the handler
// may own) or the Queue carries the translation's annotation (so that a
// stale one is removed).
//
// sideEffects is NoneOnDryRun: the handler creates ResourceClaimTemplates,
// but not on dry-run requests.
func MutatingWebhooks(driverName string, schedulers []string, clientConfig admissionregistrationv1.WebhookClientConfig, failurePolicy admissionregistrationv1.FailurePolicyType, timeoutSeconds int32) []admissionregistrationv1.MutatingWebhook {
	if len(schedulers) == 0 {
		return nil
	}
	webhook := func(name string, gvr [3]string, condition string) admissionregistrationv1.MutatingWebhook {
		ops, scope, conditionName := []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, admissionregistrationv1.NamespacedScope, translateConditionName
		if gvr[2] == queuesGVR.Resource {
			ops, scope, conditionName = append(ops, admissionregistrationv1.Update), admissionregistrationv1.ClusterScope, queueConditionName
		}
		return admissionregistrationv1.MutatingWebhook{
			Name:         name + "." + driverName,
			ClientConfig: clientConfig,
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: ops,
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{gvr[0]}, APIVersions: []string{gvr[1]}, Resources: []string{gvr[2]},
					Scope: ptr.To(scope),
				},
			}},
			MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: conditionName, Expression: condition}},
			FailurePolicy:           ptr.To(failurePolicy),
			MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNoneOnDryRun),
			TimeoutSeconds:          ptr.To(timeoutSeconds),
			AdmissionReviewVersions: []string{"v1"},
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
		}
	}
	list := schedulerList(schedulers)
	return []admissionregistrationv1.MutatingWebhook{
		webhook("pods.translate", [3]string{podsGVR.Group, podsGVR.Version, podsGVR.Resource},
			fmt.Sprintf("object.?spec.?schedulerName.orValue('') in %s && %s", list, specNeedsTranslation("object.?spec"))),
		webhook("jobs.translate", [3]string{jobsGVR.Group, jobsGVR.Version, jobsGVR.Resource},
			fmt.Sprintf("object.?spec.?tasks.orValue([]).exists(t, (t.?template.?spec.?schedulerName.orValue('') != '' ? t.template.spec.schedulerName : object.?spec.?schedulerName.orValue('')) in %s && %s)",
				list, specNeedsTranslation("t.?template.?spec"))),
		webhook("queues.translate", [3]string{queuesGVR.Group, queuesGVR.Version, queuesGVR.Resource}, queueNeedsTranslation(driverName)),
	}
}

// queueNeedsTranslation is true for a Queue with a domain-qualified key in
// one of the resource lists the translation reads, or with its annotation.
func queueNeedsTranslation(driverName string) string {
	return fmt.Sprintf("[object.?spec.?capability.orValue({}), object.?spec.?deserved.orValue({}), object.?spec.?guarantee.?resource.orValue({})].exists(l, l.exists(k, k.contains('/'))) || '%s' in object.?metadata.?annotations.orValue({})",
		TranslationAnnotation(driverName))
}

// The names of the mutating webhooks' matchConditions: pods and Jobs,
// Queues.
const (
	translateConditionName = "schedulerNeedsTranslation"
	queueConditionName     = "quotaNeedsTranslation"
)

// schedulerList is schedulers as a CEL list of strings. Scheduler names
// are DNS subdomains (Config.Validate), which need no escaping.
func schedulerList(schedulers []string) string {
	quoted := make([]string, len(schedulers))
	for i, s := range schedulers {
		quoted[i] = "'" + s + "'"
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// specNeedsTranslation is true for the optional pod spec spec with
// resourceClaims or a domain-qualified resource name in a container's or
// init container's limits or requests. Absent fields yield false, not an
// evaluation error.
func specNeedsTranslation(spec string) string {
	names := `c.?resources.?limits.orValue({}).exists(k, k.contains('/')) || c.?resources.?requests.orValue({}).exists(k, k.contains('/'))`
	return fmt.Sprintf("(%[1]s.?resourceClaims.orValue([]).size() > 0 || %[1]s.?containers.orValue([]).exists(c, %[2]s) || %[1]s.?initContainers.orValue([]).exists(c, %[2]s))", spec, names)
}
