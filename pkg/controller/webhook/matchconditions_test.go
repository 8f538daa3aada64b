package webhook

import (
	"context"
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/utils/ptr"
)

// TestMatchConditions evaluates the webhooks' matchConditions with the API
// server's own compiler and matcher, under failurePolicy Fail, where an
// evaluation error would refuse the request without calling the webhook.
func TestMatchConditions(t *testing.T) {
	// Only entries for driver (not the default gpu.dra.dev) may match.
	const driver = "gpu.example.com"
	whs := Webhooks(driver, admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://example.com" + Path)}, admissionregistrationv1.Fail, 10)
	compiler := plugincel.NewConditionCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))

	// The API server compiles new and updated configurations more strictly
	// than stored ones, which the matcher below uses.
	for _, wh := range whs {
		cond := compileConditions(compiler, wh, environment.NewExpressions)
		if errs := cond.CompilationErrors(); len(errs) > 0 || len(wh.MatchConditions) == 0 {
			t.Errorf("webhook %s: matchConditions %+v: %v", wh.Name, wh.MatchConditions, errs)
		}
	}

	ours := opaque(driver, validTimeSlicing)
	invalid := opaque(driver, invalidMPS150)
	other := opaque("nic.example.com", otherDriverJunk)
	noOpaque := resourceapi.DeviceClaimConfiguration{Requests: []string{"gpu"}}
	// gpu.dra.dev is this test's other driver: the handler's default driver
	// must not match either.
	defaultDriver := opaque("gpu.dra.dev", validTimeSlicing)
	noSpec := func(kind string) runtime.Object {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": map[string]any{"name": "x"},
		}}
	}

	tests := map[string]struct {
		op       admission.Operation
		resource string
		obj, old runtime.Object
		want     bool
	}{
		"claim with our config":                   {resource: "resourceclaims", obj: claim(ours), want: true},
		"claim with our invalid config":           {resource: "resourceclaims", obj: claim(invalid), want: true},
		"claim with another driver's and ours":    {resource: "resourceclaims", obj: claim(other, ours), want: true},
		"claim with another driver's config":      {resource: "resourceclaims", obj: claim(other)},
		"claim with gpu.dra.dev's config":         {resource: "resourceclaims", obj: claim(defaultDriver)},
		"claim without config":                    {resource: "resourceclaims", obj: claim()},
		"claim with a config without opaque":      {resource: "resourceclaims", obj: claim(noOpaque)},
		"claim without spec":                      {resource: "resourceclaims", obj: noSpec("ResourceClaim")},
		"template with our config":                {resource: "resourceclaimtemplates", obj: template(ours), want: true},
		"template with another driver's and ours": {resource: "resourceclaimtemplates", obj: template(other, ours), want: true},
		"template with another driver's config":   {resource: "resourceclaimtemplates", obj: template(other)},
		"template without config":                 {resource: "resourceclaimtemplates", obj: template()},
		"template with a config without opaque":   {resource: "resourceclaimtemplates", obj: template(noOpaque)},
		"template without spec":                   {resource: "resourceclaimtemplates", obj: noSpec("ResourceClaimTemplate")},
		"class with our config":                   {resource: "deviceclasses", obj: class(ours), want: true},
		"class with another driver's and ours":    {resource: "deviceclasses", obj: class(other, ours), want: true},
		"class with another driver's config":      {resource: "deviceclasses", obj: class(other)},
		"class without config":                    {resource: "deviceclasses", obj: class()},
		"class without spec":                      {resource: "deviceclasses", obj: noSpec("DeviceClass")},
		"class update that adds our config":       {op: admission.Update, resource: "deviceclasses", obj: class(ours), old: class(), want: true},
		"class update that keeps our config":      {op: admission.Update, resource: "deviceclasses", obj: class(ours), old: class(ours), want: true},
		// Nothing is left to validate.
		"class update that drops our config": {op: admission.Update, resource: "deviceclasses", obj: class(other), old: class(ours)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			op := tc.op
			if op == "" {
				op = admission.Create
			}
			i := slices.IndexFunc(whs, func(wh admissionregistrationv1.ValidatingWebhook) bool {
				return slices.ContainsFunc(wh.Rules, func(r admissionregistrationv1.RuleWithOperations) bool {
					return slices.Contains(r.Resources, tc.resource) && slices.Contains(r.Operations, admissionregistrationv1.OperationType(op))
				})
			})
			if i < 0 {
				t.Fatalf("no webhook for %s %s", op, tc.resource)
			}
			gvr := schema.GroupVersionResource{Group: resourceGroup, Version: "v1", Resource: tc.resource}
			gvk := tc.obj.GetObjectKind().GroupVersionKind()
			m, err := meta.Accessor(tc.obj)
			if err != nil {
				t.Fatal(err)
			}
			attrs := admission.NewAttributesRecord(tc.obj, tc.old, gvk, m.GetNamespace(), m.GetName(), gvr, "", op, nil, false, &user.DefaultInfo{Name: "alice"})
			matcher := compileMatcher(compiler, whs[i])
			got := matcher.Match(context.Background(), &admission.VersionedAttributes{
				Attributes: attrs, VersionedObject: admission.NewLazyObject(tc.obj), VersionedOldObject: admission.NewLazyObject(tc.old), VersionedKind: gvk,
			}, nil, nil)
			if got.Error != nil || got.Matches != tc.want {
				t.Errorf("webhook %s: matches %v (error %v, failed condition %q), want %v", whs[i].Name, got.Matches, got.Error, got.FailedConditionName, tc.want)
			}
		})
	}
}

// compileConditions compiles a webhook's matchConditions as the API server
// does (k8s.io/apiserver/pkg/admission/plugin/webhook's accessor, which
// would pull its client's dependencies into go.mod).
func compileConditions(compiler plugincel.ConditionCompiler, wh admissionregistrationv1.ValidatingWebhook, mode environment.Type) plugincel.ConditionEvaluator {
	exprs := make([]plugincel.ExpressionAccessor, 0, len(wh.MatchConditions))
	for _, mc := range wh.MatchConditions {
		exprs = append(exprs, ptr.To(matchconditions.MatchCondition(mc)))
	}
	return compiler.CompileCondition(exprs, plugincel.OptionalVariableDeclarations{HasAuthorizer: true}, mode)
}

// compileMatcher is the API server's matcher for a stored webhook.
func compileMatcher(compiler plugincel.ConditionCompiler, wh admissionregistrationv1.ValidatingWebhook) matchconditions.Matcher {
	return matchconditions.NewMatcher(compileConditions(compiler, wh, environment.StoredExpressions), wh.FailurePolicy, "webhook", "validating", wh.Name)
}
