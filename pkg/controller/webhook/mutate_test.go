package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/requesttranslation"
)

const volcanoJob = `{"apiVersion":"batch.volcano.sh/v1alpha1","kind":"Job","metadata":{"name":"tensorflow-job","namespace":"team"},
"spec":{"schedulerName":"volcano","minAvailable":4,"tasks":[{"replicas":4,"template":{"spec":{"containers":[{"image":"i","resources":{"limits":{"nvidia.com/gpu":2}}}]}}}]}}`

const gpuPod = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"team","futureMeta":1},
"spec":{"schedulerName":"volcano","futureSpec":{"x":[1]},"containers":[{"name":"c","image":"i","futureContainer":true,"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`

func mutator(t *testing.T, objs ...runtime.Object) (*Mutator, *fake.Clientset) {
	t.Helper()
	classes := extendedresourcecache.NewExtendedResourceCache(klog.Background())
	classes.OnAdd(&resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.dra.dev"}, Spec: resourceapi.DeviceClassSpec{ExtendedResourceName: ptr.To("nvidia.com/gpu")}}, true)
	client := fake.NewClientset(objs...)
	return NewMutator(driver, TranslationConfig{Schedulers: []string{"volcano"}, GangGuard: true, Classes: classes, Client: client}, nil), client
}

// review sends one AdmissionReview to h and returns the response and the
// object with the patch applied.
func review(t *testing.T, h http.Handler, resource metav1.GroupVersionResource, obj string, dryRun bool) (*admissionv1.AdmissionResponse, map[string]any) {
	t.Helper()
	return reviewRequest(t, h, &admissionv1.AdmissionRequest{Resource: resource, Namespace: "team", Operation: admissionv1.Create,
		Object: runtime.RawExtension{Raw: []byte(obj)}, DryRun: &dryRun})
}

// reviewRequest is review for any request.
func reviewRequest(t *testing.T, h http.Handler, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, map[string]any) {
	t.Helper()
	req.UID = types.UID("u1")
	obj := string(req.Object.Raw)
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, MutatePath, bytes.NewReader(body)))
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil || out.Response.UID != "u1" {
		t.Fatalf("response %s: %v", rec.Body, err)
	}
	result := []byte(obj)
	if len(out.Response.Patch) > 0 {
		if pt := ptr.Deref(out.Response.PatchType, ""); pt != admissionv1.PatchTypeJSONPatch {
			t.Fatalf("patch type %q", pt)
		}
		patch, err := jsonpatch.DecodePatch(out.Response.Patch)
		if err != nil {
			t.Fatal(err)
		}
		if result, err = patch.Apply(result); err != nil {
			t.Fatalf("apply %s: %v", out.Response.Patch, err)
		}
	}
	var m map[string]any
	if err := json.Unmarshal(result, &m); err != nil {
		t.Fatal(err)
	}
	return out.Response, m
}

func templateExists(t *testing.T, client *fake.Clientset, name string) bool {
	t.Helper()
	_, err := client.ResourceV1().ResourceClaimTemplates("team").Get(context.Background(), name, metav1.GetOptions{})
	return err == nil
}

func TestMutatorPod(t *testing.T) {
	h, client := mutator(t)
	resp, pod := review(t, h, podsGVR, gpuPod, false)
	if !resp.Allowed || len(resp.Patch) == 0 {
		t.Fatalf("response %+v", resp)
	}
	spec := pod["spec"].(map[string]any)
	c := spec["containers"].([]any)[0].(map[string]any)
	if pod["metadata"].(map[string]any)["futureMeta"] == nil || spec["futureSpec"] == nil || c["futureContainer"] != true {
		t.Errorf("unknown fields lost: %v", pod)
	}
	if claims := spec["resourceClaims"].([]any); len(claims) != 1 || claims[0].(map[string]any)["resourceClaimTemplateName"] != "gpu.dra.dev-x1" {
		t.Errorf("resourceClaims %v", spec["resourceClaims"])
	}
	if _, ok := pod["metadata"].(map[string]any)["annotations"].(map[string]any)[TranslationAnnotation(driver)]; !ok {
		t.Errorf("no %s annotation: %v", TranslationAnnotation(driver), pod["metadata"])
	}
	if !templateExists(t, client, "gpu.dra.dev-x1") {
		t.Error("template gpu.dra.dev-x1 not created")
	}

	// A tenant deletes the template; the next pod of the translated Job
	// (already translated: no patch) re-creates it.
	if err := client.ResourceV1().ResourceClaimTemplates("team").Delete(context.Background(), "gpu.dra.dev-x1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	translated, _ := json.Marshal(pod)
	if resp, _ := review(t, h, podsGVR, string(translated), false); !resp.Allowed || len(resp.Patch) > 0 {
		t.Errorf("translated pod: response %+v, want allowed without patch", resp)
	}
	if !templateExists(t, client, "gpu.dra.dev-x1") {
		t.Error("deleted template not re-created by the admission of a translated pod")
	}
}

func TestMutatorJob(t *testing.T) {
	h, client := mutator(t)
	// Dry run: the patch, but no template.
	resp, job := review(t, h, jobsGVR, volcanoJob, true)
	if !resp.Allowed || len(resp.Patch) == 0 || templateExists(t, client, "gpu.dra.dev-x2") {
		t.Fatalf("dry run: response %+v, template created %v", resp, templateExists(t, client, "gpu.dra.dev-x2"))
	}
	if job["spec"].(map[string]any)["minAvailable"] != float64(4) {
		t.Errorf("Job lost minAvailable: %v", job)
	}
	resp, job = review(t, h, jobsGVR, volcanoJob, false)
	if !resp.Allowed || !templateExists(t, client, "gpu.dra.dev-x2") {
		t.Fatalf("response %+v; template created %v", resp, templateExists(t, client, "gpu.dra.dev-x2"))
	}
	c := job["spec"].(map[string]any)["tasks"].([]any)[0].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	if got := c["resources"].(map[string]any); len(got["limits"].(map[string]any)) != 0 || got["requests"].(map[string]any)["cpu"] != "1m" {
		t.Errorf("task container resources %v: want no nvidia.com/gpu and the gang guard's cpu", got)
	}
}

func TestMutatorRefuses(t *testing.T) {
	tenant := requesttranslation.Template{Name: "gpu.dra.dev-x2", Class: "gpu.dra.dev", Count: 2}.Object("team")
	tenant.Labels = nil
	tests := map[string]struct {
		obj    string
		exists []runtime.Object
		field  string
	}{
		"fractional":        {obj: strings.Replace(volcanoJob, `"nvidia.com/gpu":2`, `"nvidia.com/gpu":"1500m"`, 1), field: "spec.tasks[0].template.spec.containers[0].resources.limits[nvidia.com/gpu]"},
		"tenant's template": {obj: volcanoJob, exists: []runtime.Object{tenant}, field: "ResourceClaimTemplate team/gpu.dra.dev-x2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h, _ := mutator(t, tc.exists...)
			resp, _ := review(t, h, jobsGVR, tc.obj, false)
			if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusUnprocessableEntity || resp.Result.Details == nil ||
				resp.Result.Details.Causes[0].Field != tc.field {
				t.Errorf("response %+v (%+v), want a refusal naming %s", resp, resp.Result, tc.field)
			}
		})
	}
}

// TestMutatingMatchConditions evaluates the mutating webhooks'
// matchConditions with the API server's compiler and matcher.
func TestMutatingMatchConditions(t *testing.T) {
	if whs := MutatingWebhooks(driver, nil, admissionregistrationv1.WebhookClientConfig{}, admissionregistrationv1.Fail, 10); len(whs) != 0 {
		t.Errorf("no schedulers: %d webhooks, want none", len(whs))
	}
	whs := MutatingWebhooks(driver, []string{"volcano", "kai-scheduler"}, admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://example.com" + MutatePath)}, admissionregistrationv1.Fail, 10)
	compiler := plugincel.NewConditionCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	asValidating := func(wh admissionregistrationv1.MutatingWebhook) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{Name: wh.Name, MatchConditions: wh.MatchConditions, FailurePolicy: wh.FailurePolicy}
	}
	for _, wh := range whs {
		if errs := compileConditions(compiler, asValidating(wh), environment.NewExpressions).CompilationErrors(); len(errs) > 0 {
			t.Errorf("webhook %s: %v", wh.Name, errs)
		}
	}
	obj := func(s string) runtime.Object {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON([]byte(s)); err != nil {
			t.Fatal(err)
		}
		return u
	}
	pod := func(scheduler, rest string) runtime.Object {
		return obj(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"schedulerName":"` + scheduler + `"` + rest + `}}`)
	}
	tests := map[string]struct {
		wh   int
		obj  runtime.Object
		want bool
	}{
		"volcano pod with nvidia.com/gpu":           {obj: pod("volcano", `,"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":1}}}]`), want: true},
		"second scheduler, init container request":  {obj: pod("kai-scheduler", `,"initContainers":[{"name":"c","resources":{"requests":{"example.com/x":1}}}],"containers":[{"name":"c"}]`), want: true},
		"volcano pod with claims":                   {obj: pod("volcano", `,"resourceClaims":[{"name":"g","resourceClaimTemplateName":"t"}],"containers":[{"name":"c"}]`), want: true},
		"volcano pod with cpu only":                 {obj: pod("volcano", `,"containers":[{"name":"c","resources":{"limits":{"cpu":1}}}]`)},
		"default scheduler pod with nvidia.com/gpu": {obj: pod("default-scheduler", `,"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":1}}}]`)},
		"job of volcano":                            {wh: 1, obj: obj(volcanoJob), want: true},
		"job task with its own scheduler":           {wh: 1, obj: obj(strings.Replace(volcanoJob, `"template":{"spec":{`, `"template":{"spec":{"schedulerName":"default-scheduler",`, 1))},
		"job without tasks' templates":              {wh: 1, obj: obj(`{"apiVersion":"batch.volcano.sh/v1alpha1","kind":"Job","metadata":{"name":"j"},"spec":{"schedulerName":"volcano","tasks":[{"replicas":1}]}}`)},
		"job without spec":                          {wh: 1, obj: obj(`{"apiVersion":"batch.volcano.sh/v1alpha1","kind":"Job","metadata":{"name":"j"}}`)},
		"queue with nvidia.com/gpu capability":      {wh: 2, obj: obj(gpuQueue), want: true},
		"queue with a guarantee of deviceclass":     {wh: 2, obj: obj(`{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"q"},"spec":{"guarantee":{"resource":{"deviceclass/gpu.dra.dev":1}}}}`), want: true},
		"queue with deserved nvidia.com/gpu":        {wh: 2, obj: obj(`{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"q"},"spec":{"deserved":{"nvidia.com/gpu":1}}}`), want: true},
		"queue with the annotation only":            {wh: 2, obj: obj(`{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"q","annotations":{"gpu.dra.dev/translated":"x"}},"spec":{"capability":{"cpu":1}}}`), want: true},
		"queue with cpu only":                       {wh: 2, obj: obj(`{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"q","annotations":{"a":"b"}},"spec":{"capability":{"cpu":1},"guarantee":{}}}`)},
		"queue without spec":                        {wh: 2, obj: obj(`{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"q"}}`)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			wh := whs[tc.wh]
			r := wh.Rules[0]
			gvr := schema.GroupVersionResource{Group: r.APIGroups[0], Version: r.APIVersions[0], Resource: r.Resources[0]}
			gvk := tc.obj.GetObjectKind().GroupVersionKind()
			attrs := admission.NewAttributesRecord(tc.obj, nil, gvk, "team", "x", gvr, "", admission.Create, nil, false, &user.DefaultInfo{Name: "alice"})
			got := compileMatcher(compiler, asValidating(wh)).Match(context.Background(), &admission.VersionedAttributes{
				Attributes: attrs, VersionedObject: admission.NewLazyObject(tc.obj), VersionedKind: gvk,
			}, nil, nil)
			if got.Error != nil || got.Matches != tc.want {
				t.Errorf("webhook %s: matches %v (error %v), want %v", wh.Name, got.Matches, got.Error, tc.want)
			}
		})
	}
}
