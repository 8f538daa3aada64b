package webhook

import (
	"context"
	"net/http"
	"slices"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	k8smetrics "k8s.io/component-base/metrics"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/internal/metricstest"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
)

func quota(names ...string) *corev1.ResourceQuota {
	q := &corev1.ResourceQuota{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ResourceQuota"},
		ObjectMeta: metav1.ObjectMeta{Name: "gpus", Namespace: "ns"},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{}},
	}
	for _, n := range names {
		q.Spec.Hard[corev1.ResourceName(n)] = resource.MustParse("8")
	}
	return q
}

const (
	warnGPU       = `spec.hard[nvidia.com/gpu]: not enforced (quota counts extended resources only with the "requests." prefix); use requests.nvidia.com/gpu`
	warnLimitsGPU = `spec.hard[limits.nvidia.com/gpu]: not enforced (quota counts extended resources only with the "requests." prefix); use requests.nvidia.com/gpu`
	warnMIG       = `spec.hard[nvidia.com/mig-1g.10gb]: not enforced (quota counts extended resources only with the "requests." prefix); use requests.nvidia.com/mig-1g.10gb`
)

// quotaCases are the spec.hard keys of ResourceQuotas and the warnings they
// get, shared by the handler's and the matchCondition's tests.
var quotaCases = map[string]struct {
	names  []string
	served []string // NewHandler's and Webhooks' quotaNames
	want   []string
}{
	"device plugin name without prefix":    {names: []string{"nvidia.com/gpu"}, want: []string{warnGPU}},
	"limits prefix, accepted, not counted": {names: []string{"limits.nvidia.com/gpu"}, want: []string{warnLimitsGPU}},
	"MIG name and renamed share, sorted": {
		names: []string{"nvidia.com/mig-1g.10gb", "nvidia.com/gpu.shared", "requests.nvidia.com/gpu", "pods"},
		want: []string{
			`spec.hard[nvidia.com/gpu.shared]: not enforced (quota counts extended resources only with the "requests." prefix); use requests.nvidia.com/gpu.shared`,
			warnMIG,
		},
	},
	"both spellings: the unprefixed one still counts nothing": {names: []string{"nvidia.com/gpu", "requests.nvidia.com/gpu"}, want: []string{warnGPU}},
	"requests prefix":           {names: []string{"requests.nvidia.com/gpu", "requests.nvidia.com/mig-1g.10gb"}},
	"DRA device class quota":    {names: []string{"gpu.dra.dev.deviceclass.resource.k8s.io/devices", "requests.deviceclass.resource.kubernetes.io/gpu.dra.dev"}},
	"other vendor's name":       {names: []string{"example.com/gpu", "nvidia.com/gpus", "nvidia.com/gpushared"}},
	"standard and object count": {names: []string{"cpu", "requests.memory", "count/deployments.apps"}},
	"empty hard":                {},
	"name the chart's classes serve": {
		names:  []string{"example.com/gpu", "limits.example.com/gpu", "requests.example.com/gpu", "example.com/other"},
		served: []string{"example.com/gpu", "nvidia.com/gpu"},
		want: []string{
			`spec.hard[example.com/gpu]: not enforced (quota counts extended resources only with the "requests." prefix); use requests.example.com/gpu`,
			`spec.hard[limits.example.com/gpu]: not enforced (quota counts extended resources only with the "requests." prefix); use requests.example.com/gpu`,
		},
	},
	"served name, prefixed right":     {names: []string{"requests.example.com/gpu"}, served: []string{"example.com/gpu"}},
	"served name only as a suffix":    {names: []string{"x.example.com/gpu", "example.com/gpu.x"}, served: []string{"example.com/gpu"}},
	"device plugin names, served too": {names: []string{"nvidia.com/gpu"}, served: []string{"nvidia.com/gpu"}, want: []string{warnGPU}},
}

// TestQuotaWarnings: a ResourceQuota is always admitted; one whose spec.hard
// limits a device plugin name the quota evaluators never count gets a
// warning naming the key and the fix.
func TestQuotaWarnings(t *testing.T) {
	for name, tc := range quotaCases {
		for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
			t.Run(name+"/"+string(op), func(t *testing.T) {
				var old any
				if op == admissionv1.Update {
					old = quota()
				}
				code, resp, text := post(t, NewHandler(driver, nil, tc.served...), reviewJSON(t, op, quotasGVR, quota(tc.names...), old))
				if code != http.StatusOK {
					t.Fatalf("HTTP %d: %s", code, text)
				}
				if !resp.Allowed || resp.Result != nil {
					t.Errorf("allowed %v, result %+v: a quota must never be refused", resp.Allowed, resp.Result)
				}
				if !slices.Equal(resp.Warnings, tc.want) {
					t.Errorf("warnings:\n got %q\nwant %q", resp.Warnings, tc.want)
				}
			})
		}
	}
	t.Run("undecodable quota is admitted, latency labelled resourcequotas", func(t *testing.T) {
		reg := k8smetrics.NewKubeRegistry()
		m := metrics.New()
		m.MustRegister(reg)
		_, resp, _ := post(t, NewHandler(driver, m), reviewJSON(t, admissionv1.Create, quotasGVR, map[string]any{"spec": "x"}, nil))
		if resp == nil || !resp.Allowed || len(resp.Warnings) != 0 {
			t.Errorf("response %+v, want allowed without warnings", resp)
		}
		if n := metricstest.Value(t, reg, "gpu_dra_controller_admission_duration_seconds", map[string]string{"resource": quotasGVR.Resource, "allowed": "true"}); n != 1 {
			t.Errorf("resourcequotas latency samples = %v, want 1", n)
		}
	})
}

// TestQuotaMatchCondition: the quota webhook's matchCondition, evaluated by
// the API server's matcher, calls the webhook exactly for the quotas that
// get a warning, so the two spellings of the rule cannot drift apart.
func TestQuotaMatchCondition(t *testing.T) {
	compiler := plugincel.NewConditionCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	gvr := schema.GroupVersionResource{Version: "v1", Resource: quotasGVR.Resource}
	for name, tc := range quotaCases {
		t.Run(name, func(t *testing.T) {
			whs := Webhooks(driver, admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://example.com" + Path)}, admissionregistrationv1.Fail, 10, tc.served...)
			i := slices.IndexFunc(whs, func(wh admissionregistrationv1.ValidatingWebhook) bool {
				return wh.Rules[0].Resources[0] == quotasGVR.Resource
			})
			if i < 0 {
				t.Fatal("no webhook for resourcequotas")
			}
			wh := whs[i]
			if ptr.Deref(wh.FailurePolicy, "") != admissionregistrationv1.Ignore {
				t.Errorf("quota webhook failurePolicy %v under Fail: want Ignore, a warning must never block a quota", ptr.Deref(wh.FailurePolicy, ""))
			}
			if errs := compileConditions(compiler, wh, environment.NewExpressions).CompilationErrors(); len(errs) > 0 {
				t.Fatalf("matchConditions %+v: %v", wh.MatchConditions, errs)
			}
			matcher := compileMatcher(compiler, wh)
			obj := quota(tc.names...)
			if tc.names == nil {
				obj.Spec.Hard = nil // no spec.hard at all
			}
			gvk := obj.GroupVersionKind()
			attrs := admission.NewAttributesRecord(obj, nil, gvk, obj.Namespace, obj.Name, gvr, "", admission.Create, nil, false, &user.DefaultInfo{Name: "alice"})
			got := matcher.Match(context.Background(), &admission.VersionedAttributes{
				Attributes: attrs, VersionedObject: admission.NewLazyObject(obj), VersionedKind: gvk,
			}, nil, nil)
			if want := len(tc.want) > 0; got.Error != nil || got.Matches != want {
				t.Errorf("matches %v (error %v), want %v; condition %s", got.Matches, got.Error, want, wh.MatchConditions[0].Expression)
			}
		})
	}
}

// TestQuotaNames: the names --quota-resource-names adds are those the
// device plugin names do not cover, once each, in order.
func TestQuotaNames(t *testing.T) {
	got := QuotaNames([]string{"nvidia.com/gpu", "example.com/gpu", "", "nvidia.com/mig-1g.10gb", "example.com/mps", "example.com/gpu", "nvidia.com/gpu.shared"})
	if want := []string{"example.com/gpu", "example.com/mps"}; !slices.Equal(got, want) {
		t.Errorf("QuotaNames = %q, want %q", got, want)
	}
}
