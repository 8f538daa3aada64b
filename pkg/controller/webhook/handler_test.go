package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8smetrics "k8s.io/component-base/metrics"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/internal/metricstest"
	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/metrics"
)

const (
	driver     = "gpu.dra.dev"
	rejections = "gpu_dra_controller_admission_rejections_total"
)

const (
	validTimeSlicing = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`
	validMigMPS      = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50}}}`
	invalidMPS150    = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":150}}}`
	unknownField     = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","bogus":1}}`
	unknownKind      = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"TpuConfig"}`
	badInterval      = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Forever"}}}`
	otherDriverJunk  = `{"anything":"goes","for":["other","drivers"]}`

	msg150 = "sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 150: must be a percentage of the device's threads from 1 to 100"
)

func opaque(driverName, params string, requests ...string) resourceapi.DeviceClaimConfiguration {
	return resourceapi.DeviceClaimConfiguration{
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

func claim(configs ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{
				{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.dra.dev"}},
				{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "nic.example.com"}},
			},
			Config: configs,
		}},
	}
}

func template(configs ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "ns"},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: claim(configs...).Spec},
	}
}

func class(configs ...resourceapi.DeviceClaimConfiguration) *resourceapi.DeviceClass {
	c := &resourceapi.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: "mps.gpu.dra.dev"},
	}
	for _, cfg := range configs {
		c.Spec.Config = append(c.Spec.Config, resourceapi.DeviceClassConfiguration{DeviceConfiguration: cfg.DeviceConfiguration})
	}
	return c
}

var (
	claimsGVR    = metav1.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaims"}
	templatesGVR = metav1.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaimtemplates"}
	classesGVR   = metav1.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "deviceclasses"}
)

// reviewJSON builds the AdmissionReview the API server would send.
func reviewJSON(t testing.TB, op admissionv1.Operation, gvr metav1.GroupVersionResource, obj, old any) []byte {
	t.Helper()
	raw := func(o any) runtime.RawExtension {
		if o == nil {
			return runtime.RawExtension{}
		}
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	r := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("uid-1"), Resource: gvr, Operation: op, Name: "x", Namespace: "ns",
			Object: raw(obj), OldObject: raw(old),
		},
	}
	b, err := json.Marshal(&r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// post serves body and returns the HTTP status and, on 200, the response.
func post(t testing.TB, h http.Handler, body []byte) (int, *admissionv1.AdmissionResponse, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return rec.Code, nil, rec.Body.String()
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("decode response: %v\n%s", err, rec.Body.String())
	}
	if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" {
		t.Errorf("response TypeMeta = %+v, want admission.k8s.io/v1 AdmissionReview", out.TypeMeta)
	}
	if out.Response == nil {
		t.Fatalf("no response in %s", rec.Body.String())
	}
	if out.Response.UID != "uid-1" {
		t.Errorf("response UID = %q, want uid-1", out.Response.UID)
	}
	return rec.Code, out.Response, ""
}

func TestAdmission(t *testing.T) {
	tests := map[string]struct {
		op       admissionv1.Operation
		gvr      metav1.GroupVersionResource
		obj, old any
		sub      string

		wantAllowed bool
		// wantMessage is the exact denial message; wantContains parts of it.
		wantMessage  string
		wantContains []string
		wantReason   metav1.StatusReason
		wantCause    string // one cause's field
		wantWarning  string
	}{
		"claim without configs": {op: admissionv1.Create, gvr: claimsGVR, obj: claim(), wantAllowed: true},
		"claim with valid config": {
			op: admissionv1.Create, gvr: claimsGVR, wantAllowed: true,
			obj: claim(opaque(driver, validTimeSlicing, "gpu")),
		},
		"claim with valid MIG config": {
			op: admissionv1.Create, gvr: claimsGVR, wantAllowed: true,
			obj: claim(opaque(driver, validMigMPS)),
		},
		"claim with other driver's config only": {
			op: admissionv1.Create, gvr: claimsGVR, wantAllowed: true,
			obj: claim(opaque("nic.example.com", otherDriverJunk, "nic")),
		},
		"claim with invalid config after another driver's": {
			op: admissionv1.Create, gvr: claimsGVR,
			obj:         claim(opaque("nic.example.com", otherDriverJunk, "nic"), opaque(driver, invalidMPS150, "gpu")),
			wantMessage: "spec.devices.config[1].opaque.parameters: " + msg150,
			wantReason:  metav1.StatusReasonInvalid,
			wantCause:   "spec.devices.config[1].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage",
		},
		"claim config for a request of another driver's class is still ours to check": {
			op: admissionv1.Create, gvr: claimsGVR,
			obj:         claim(opaque(driver, invalidMPS150, "nic")),
			wantMessage: "spec.devices.config[0].opaque.parameters: " + msg150,
		},
		"claim with unknown field": {
			op: admissionv1.Create, gvr: claimsGVR,
			obj:          claim(opaque(driver, unknownField)),
			wantContains: []string{"spec.devices.config[0].opaque.parameters: decode GpuConfig: ", `unknown field "sharing.bogus"`},
			wantCause:    "spec.devices.config[0].opaque.parameters",
		},
		"claim with unknown kind": {
			op: admissionv1.Create, gvr: claimsGVR,
			obj:          claim(opaque(driver, unknownKind)),
			wantContains: []string{"spec.devices.config[0].opaque.parameters: kind: Unsupported value: \"TpuConfig\""},
			wantCause:    "spec.devices.config[0].opaque.parameters.kind",
		},
		"claim with two invalid configs reports both": {
			op: admissionv1.Create, gvr: claimsGVR,
			obj: claim(opaque(driver, invalidMPS150), opaque(driver, validTimeSlicing), opaque(driver, badInterval)),
			wantContains: []string{
				"spec.devices.config[0].opaque.parameters: " + msg150 + "; ",
				`spec.devices.config[2].opaque.parameters: sharing.timeSlicingConfig.interval: Unsupported value: "Forever"`,
			},
		},
		"template with valid config": {
			op: admissionv1.Create, gvr: templatesGVR, wantAllowed: true,
			obj: template(opaque(driver, validTimeSlicing)),
		},
		"template with invalid config": {
			op: admissionv1.Create, gvr: templatesGVR,
			obj:         template(opaque(driver, invalidMPS150)),
			wantMessage: "spec.spec.devices.config[0].opaque.parameters: " + msg150,
			wantCause:   "spec.spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage",
		},
		"template with other driver's config": {
			op: admissionv1.Create, gvr: templatesGVR, wantAllowed: true,
			obj: template(opaque("nic.example.com", otherDriverJunk)),
		},
		"class with valid config": {
			op: admissionv1.Create, gvr: classesGVR, wantAllowed: true,
			obj: class(opaque(driver, validTimeSlicing)),
		},
		"class with invalid config": {
			op: admissionv1.Create, gvr: classesGVR,
			obj:         class(opaque("nic.example.com", otherDriverJunk), opaque(driver, invalidMPS150)),
			wantMessage: "spec.config[1].opaque.parameters: " + msg150,
		},
		"class with other driver's config": {
			op: admissionv1.Create, gvr: classesGVR, wantAllowed: true,
			obj: class(opaque("nic.example.com", otherDriverJunk)),
		},
		"class update keeping an invalid config": {
			op: admissionv1.Update, gvr: classesGVR, wantAllowed: true,
			obj: class(opaque(driver, invalidMPS150)), old: class(opaque(driver, invalidMPS150)),
		},
		"class update introducing an invalid config": {
			op: admissionv1.Update, gvr: classesGVR,
			obj:         class(opaque(driver, validTimeSlicing), opaque(driver, invalidMPS150)),
			old:         class(opaque(driver, validTimeSlicing)),
			wantMessage: "spec.config[1].opaque.parameters: " + msg150,
		},
		"claim update with an invalid config (finalizer removal)": {
			op: admissionv1.Update, gvr: claimsGVR, wantAllowed: true,
			obj: claim(opaque(driver, invalidMPS150)), old: claim(opaque(driver, invalidMPS150)),
		},
		"delete is not checked": {
			op: admissionv1.Delete, gvr: claimsGVR, wantAllowed: true,
			old: claim(opaque(driver, invalidMPS150)),
		},
		"status subresource is not checked": {
			op: admissionv1.Update, gvr: claimsGVR, sub: "status", wantAllowed: true,
			obj: claim(opaque(driver, invalidMPS150)), old: claim(opaque(driver, invalidMPS150)),
		},
		"older API version of a claim": {
			op:          admissionv1.Create,
			gvr:         metav1.GroupVersionResource{Group: "resource.k8s.io", Version: "v1beta2", Resource: "resourceclaims"},
			obj:         claim(opaque(driver, invalidMPS150)),
			wantMessage: "spec.devices.config[0].opaque.parameters: " + msg150,
		},
		"unhandled resource is admitted with a warning": {
			op: admissionv1.Create, gvr: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, wantAllowed: true,
			obj:         map[string]any{"kind": "Pod"},
			wantWarning: "v1/pods is not validated",
		},
		"object that is not a claim": {
			op: admissionv1.Create, gvr: claimsGVR,
			obj:          map[string]any{"spec": "not an object"},
			wantContains: []string{"decode resourceclaims.v1.resource.k8s.io: "},
			wantReason:   metav1.StatusReasonBadRequest,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			body := reviewJSON(t, tc.op, tc.gvr, tc.obj, tc.old)
			if tc.sub != "" {
				var r admissionv1.AdmissionReview
				_ = json.Unmarshal(body, &r)
				r.Request.SubResource = tc.sub
				body, _ = json.Marshal(&r)
			}
			code, resp, text := post(t, NewHandler(driver, nil), body)
			if code != http.StatusOK {
				t.Fatalf("HTTP %d: %s", code, text)
			}
			if resp.Allowed != tc.wantAllowed {
				t.Fatalf("allowed = %v, want %v (result %+v)", resp.Allowed, tc.wantAllowed, resp.Result)
			}
			if tc.wantWarning != "" && (len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], tc.wantWarning)) {
				t.Errorf("warnings = %q, want one containing %q", resp.Warnings, tc.wantWarning)
			}
			if tc.wantAllowed {
				if resp.Result != nil {
					t.Errorf("allowed with result %+v", resp.Result)
				}
				return
			}
			if resp.Result == nil {
				t.Fatal("denied without result")
			}
			msg := resp.Result.Message
			if tc.wantMessage != "" && msg != tc.wantMessage {
				t.Errorf("message:\n got %q\nwant %q", msg, tc.wantMessage)
			}
			for _, part := range tc.wantContains {
				if !strings.Contains(msg, part) {
					t.Errorf("message %q does not contain %q", msg, part)
				}
			}
			wantReason := tc.wantReason
			if wantReason == "" {
				wantReason = metav1.StatusReasonInvalid
			}
			if resp.Result.Reason != wantReason || resp.Result.Status != metav1.StatusFailure {
				t.Errorf("status %q reason %q, want Failure %q", resp.Result.Status, resp.Result.Reason, wantReason)
			}
			if tc.wantCause != "" {
				checkCause(t, resp, tc.wantCause)
			}
		})
	}
}

// checkCause checks that a denial lists a cause for the field.
func checkCause(t *testing.T, resp *admissionv1.AdmissionResponse, field string) {
	t.Helper()
	for _, c := range resp.Result.Details.Causes {
		if c.Field == field {
			return
		}
	}
	t.Errorf("causes %+v lack field %q", resp.Result.Details.Causes, field)
}

func TestMalformedReview(t *testing.T) {
	valid := reviewJSON(t, admissionv1.Create, claimsGVR, claim(), nil)
	tests := map[string]struct {
		method, contentType string
		body                []byte
		wantCode            int
		wantText            string
	}{
		"not JSON":         {body: []byte("{not json"), wantCode: http.StatusBadRequest, wantText: "decode AdmissionReview"},
		"empty body":       {body: nil, wantCode: http.StatusBadRequest, wantText: "decode AdmissionReview"},
		"no request":       {body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), wantCode: http.StatusBadRequest, wantText: "no request"},
		"v1beta1 review":   {body: []byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`), wantCode: http.StatusBadRequest, wantText: "admissionReviewVersions"},
		"no TypeMeta":      {body: []byte(`{"request":{"uid":"x"}}`), wantCode: http.StatusBadRequest, wantText: "want admission.k8s.io/v1 AdmissionReview"},
		"GET":              {method: http.MethodGet, body: valid, wantCode: http.StatusMethodNotAllowed},
		"wrong media type": {contentType: "application/yaml", body: valid, wantCode: http.StatusUnsupportedMediaType},
		"too large":        {body: bytes.Repeat([]byte(" "), maxRequestBytes+1), wantCode: http.StatusRequestEntityTooLarge},
		"valid, charset":   {contentType: "application/json; charset=utf-8", body: valid, wantCode: http.StatusOK},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			reg := k8smetrics.NewKubeRegistry()
			m := metrics.New()
			m.MustRegister(reg)
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			req := httptest.NewRequest(method, Path, bytes.NewReader(tc.body))
			ct := tc.contentType
			if ct == "" {
				ct = "application/json"
			}
			req.Header.Set("Content-Type", ct)
			rec := httptest.NewRecorder()
			NewHandler(driver, m).ServeHTTP(rec, req)
			if rec.Code != tc.wantCode {
				t.Fatalf("HTTP %d, want %d: %s", rec.Code, tc.wantCode, rec.Body.String())
			}
			if !strings.Contains(rec.Body.String(), tc.wantText) {
				t.Errorf("body %q does not contain %q", rec.Body.String(), tc.wantText)
			}
			bad := metricstest.Value(t, reg, rejections, map[string]string{"resource": "unknown", "reason": metrics.ReasonBadRequest})
			if want := map[bool]float64{true: 0, false: 1}[tc.wantCode == http.StatusOK]; bad != want {
				t.Errorf("bad_request rejections = %v, want %v", bad, want)
			}
		})
	}
}

func TestRejectionMetrics(t *testing.T) {
	reg := k8smetrics.NewKubeRegistry()
	m := metrics.New()
	m.MustRegister(reg)
	h := NewHandler(driver, m)
	for _, body := range [][]byte{
		reviewJSON(t, admissionv1.Create, claimsGVR, claim(opaque(driver, invalidMPS150)), nil),
		reviewJSON(t, admissionv1.Create, claimsGVR, claim(opaque(driver, unknownField)), nil),
		reviewJSON(t, admissionv1.Create, classesGVR, class(opaque(driver, invalidMPS150)), nil),
		reviewJSON(t, admissionv1.Create, classesGVR, class(opaque(driver, validTimeSlicing)), nil),
	} {
		post(t, h, body)
	}
	for _, c := range []struct {
		resource, reason string
		want             float64
	}{
		{"resourceclaims", metrics.ReasonInvalid, 1},
		{"resourceclaims", metrics.ReasonDecode, 1},
		{"deviceclasses", metrics.ReasonInvalid, 1},
		{"deviceclasses", metrics.ReasonDecode, 0},
	} {
		got := metricstest.Value(t, reg, rejections, map[string]string{"resource": c.resource, "reason": c.reason})
		if got != c.want {
			t.Errorf("rejections{%s,%s} = %v, want %v", c.resource, c.reason, got, c.want)
		}
	}
	if n := metricstest.Value(t, reg, "gpu_dra_controller_admission_duration_seconds", map[string]string{"resource": "deviceclasses"}); n != 2 {
		t.Errorf("deviceclasses latency samples = %v, want 2", n)
	}
}
