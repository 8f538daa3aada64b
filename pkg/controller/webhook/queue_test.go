package webhook

import (
	"encoding/json"
	"net/http"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

const gpuQueue = `{"apiVersion":"scheduling.volcano.sh/v1beta1","kind":"Queue","metadata":{"name":"team-a"},
"spec":{"reclaimable":true,"capability":{"cpu":"64","nvidia.com/gpu":"4"}}}`

// TestMutatorQueue: a Queue's capability of 4 nvidia.com/gpu gets the
// DeviceClass quota key Volcano's capacity plugin counts translated claims
// against, on create and when an update changes it; a conflicting key of
// the user is refused naming the field.
func TestMutatorQueue(t *testing.T) {
	h, _ := mutator(t)
	queueReview := func(op admissionv1.Operation, obj, old string) (*admissionv1.AdmissionResponse, map[string]any) {
		req := &admissionv1.AdmissionRequest{Resource: queuesGVR, Name: "team-a", Operation: op, Object: runtime.RawExtension{Raw: []byte(obj)}}
		if old != "" {
			req.OldObject = runtime.RawExtension{Raw: []byte(old)}
		}
		return reviewRequest(t, h, req)
	}
	capability := func(q map[string]any) map[string]any {
		return q["spec"].(map[string]any)["capability"].(map[string]any)
	}

	resp, q := queueReview(admissionv1.Create, gpuQueue, "")
	if !resp.Allowed || len(resp.Patch) == 0 {
		t.Fatalf("create: response %+v", resp)
	}
	if c := capability(q); c["deviceclass/gpu.dra.dev"] != "4" || c["nvidia.com/gpu"] != "4" || c["cpu"] != "64" {
		t.Errorf("capability %v, want nvidia.com/gpu and deviceclass/gpu.dra.dev 4", c)
	}
	if got := q["metadata"].(map[string]any)["annotations"].(map[string]any)[TranslationAnnotation(driver)]; got != "spec.capability[deviceclass/gpu.dra.dev]" {
		t.Errorf("annotation %v", got)
	}
	created, _ := json.Marshal(q)

	// Updated unchanged: nothing to do. nvidia.com/gpu raised: the derived key follows.
	if resp, _ := queueReview(admissionv1.Update, string(created), string(created)); !resp.Allowed || len(resp.Patch) != 0 {
		t.Errorf("unchanged update: response %+v, want allowed without patch", resp)
	}
	capability(q)["nvidia.com/gpu"] = "6"
	raised, _ := json.Marshal(q)
	if resp, q := queueReview(admissionv1.Update, string(raised), string(created)); !resp.Allowed || capability(q)["deviceclass/gpu.dra.dev"] != "6" {
		t.Errorf("update to 6: response %+v, capability %v", resp, capability(q))
	}

	// The user's own key, different from nvidia.com/gpu.
	capability(q)["deviceclass/gpu.dra.dev"] = "8"
	conflict, _ := json.Marshal(q)
	resp, _ = queueReview(admissionv1.Update, string(conflict), string(raised))
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusUnprocessableEntity || resp.Result.Details == nil ||
		resp.Result.Details.Causes[0].Field != "spec.capability[deviceclass/gpu.dra.dev]" {
		t.Errorf("conflicting key: response %+v (%+v), want a refusal naming spec.capability[deviceclass/gpu.dra.dev]", resp, resp.Result)
	}
}
