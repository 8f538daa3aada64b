// Package vaptest renders the chart's ValidatingAdmissionPolicies with helm
// and evaluates them with the API server's own CEL compiler and validator,
// so tests check what a policy admits and denies without an API server.
package vaptest

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// Render runs `helm template release chart -n namespace` (only the
// template showOnly, if set) with helm ($HELM or helm on PATH;
// hack/cluster builds one), and skips the test without helm.
func Render(t testing.TB, chart, release, namespace, showOnly string, values ...string) (string, error) {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		var err error
		if helm, err = exec.LookPath("helm"); err != nil {
			t.Skip("SKIP: no helm ($HELM or on PATH) to render the chart's admission policy; hack/cluster/build.sh builds one")
		}
	}
	args := append([]string{"template", release, chart, "-n", namespace}, values...)
	if showOnly != "" {
		args = append(args, "--show-only", showOnly)
	}
	out, err := exec.Command(helm, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Find returns the policy of rendered YAML whose name ends in suffix.
func Find(t testing.TB, rendered, suffix string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	for _, doc := range strings.Split(rendered, "\n---\n") {
		var vap admissionregistrationv1.ValidatingAdmissionPolicy
		if err := yaml.UnmarshalStrict([]byte(doc), &vap); err != nil || vap.Kind != "ValidatingAdmissionPolicy" {
			continue
		}
		if strings.HasSuffix(vap.Name, suffix) {
			return &vap
		}
	}
	t.Fatalf("the chart renders no policy *%s:\n%s", suffix, rendered)
	return nil
}

// Policy is a compiled ValidatingAdmissionPolicy.
type Policy struct {
	spec                  *admissionregistrationv1.ValidatingAdmissionPolicy
	match                 matchconditions.Matcher
	validations, messages plugincel.ConditionEvaluator
}

// Compile compiles a policy as the API server's ValidatingAdmissionPolicy
// plugin does (validating.compilePolicy, whose package would pull its
// tracing dependencies into go.mod): variables composited, an authorizer
// declared, new expressions (the strict checks for a policy being created).
func Compile(t testing.TB, p *admissionregistrationv1.ValidatingAdmissionPolicy) *Policy {
	t.Helper()
	compiler, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	vars := plugincel.OptionalVariableDeclarations{HasAuthorizer: true}
	var named []plugincel.NamedExpressionAccessor
	for _, v := range p.Spec.Variables {
		named = append(named, &expression{name: v.Name, expr: v.Expression, types: []*cel.Type{cel.AnyType, cel.DynType}})
	}
	compiler.CompileAndStoreVariables(named, vars, environment.NewExpressions)
	var conds []plugincel.ExpressionAccessor
	for i := range p.Spec.MatchConditions {
		conds = append(conds, ptr.To(matchconditions.MatchCondition(p.Spec.MatchConditions[i])))
	}
	validations := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(p.Spec.Validations))
	for i, v := range p.Spec.Validations {
		validations[i] = &expression{expr: v.Expression, types: []*cel.Type{cel.BoolType}}
		messages[i] = &expression{expr: cmp.Or(v.MessageExpression, "''"), types: []*cel.Type{cel.StringType}}
	}
	pol := &Policy{
		spec:        p,
		match:       matchconditions.NewMatcher(compiler.CompileCondition(conds, vars, environment.NewExpressions), p.Spec.FailurePolicy, "policy", "validate", p.Name),
		validations: compiler.CompileCondition(validations, vars, environment.NewExpressions),
		messages:    compiler.CompileCondition(messages, plugincel.OptionalVariableDeclarations{}, environment.NewExpressions),
	}
	for _, errs := range [][]error{pol.validations.CompilationErrors(), pol.messages.CompilationErrors()} {
		for _, err := range errs {
			t.Errorf("policy %s: %v", p.Name, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return pol
}

// expression is a CEL expression of a policy, named for variables.
type expression struct {
	name, expr string
	types      []*cel.Type
}

func (e *expression) GetExpression() string    { return e.expr }
func (e *expression) ReturnTypes() []*cel.Type { return e.types }
func (e *expression) GetName() string          { return e.name }

// Request is one admission request: obj is the new object (nil for a
// delete), old the old one (nil for a create).
type Request struct {
	Operation admission.Operation
	Object    runtime.Object
	OldObject runtime.Object
	Namespace string
	Name      string
	Kind      schema.GroupVersionKind
	Resource  schema.GroupVersionResource
	User      user.Info
}

// Admit evaluates the policy: matched is false when its match conditions
// leave the request alone; otherwise denied is "" when it admits the
// request, else the message of the first validation that failed, the one
// the API server reports. An evaluation error fails the test: under
// failurePolicy Fail it would deny with an unreadable message.
func (p *Policy) Admit(t testing.TB, r Request) (matched bool, denied string) {
	t.Helper()
	attrs := admission.NewAttributesRecord(r.Object, r.OldObject, r.Kind, r.Namespace, r.Name, r.Resource, "", r.Operation, nil, false, r.User)
	versioned := &admission.VersionedAttributes{Attributes: attrs, VersionedKind: r.Kind,
		VersionedObject: admission.NewLazyObject(r.Object), VersionedOldObject: admission.NewLazyObject(r.OldObject)}
	ctx := context.Background()
	m := p.match.Match(ctx, versioned, nil, nil)
	if m.Error != nil {
		t.Fatalf("match conditions: %v", m.Error)
	}
	if !m.Matches {
		return false, ""
	}
	request := plugincel.CreateAdmissionRequest(attrs, metav1.GroupVersionResource(r.Resource), metav1.GroupVersionKind(r.Kind))
	results, _, err := p.validations.ForInput(ctx, versioned, request, plugincel.OptionalVariableBindings{}, nil, celconfig.RuntimeCELCostBudget)
	if err != nil {
		t.Fatal(err)
	}
	messages, _, err := p.messages.ForInput(ctx, versioned, request, plugincel.OptionalVariableBindings{}, nil, celconfig.RuntimeCELCostBudget)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	for i, res := range results {
		switch {
		case res.Error != nil:
			t.Errorf("validation %d: evaluation error: %v", i, res.Error)
		case res.EvalResult != types.True:
			msg := p.spec.Spec.Validations[i].Message
			if s, ok := messages[i].EvalResult.Value().(string); ok && s != "" {
				msg = s
			}
			msgs = append(msgs, msg)
		}
	}
	if len(msgs) == 0 {
		return true, ""
	}
	return true, msgs[0]
}
