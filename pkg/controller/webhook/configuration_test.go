package webhook

import (
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/utils/ptr"
)

func TestWebhooksCoverHandledResources(t *testing.T) {
	cc := admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
		Namespace: "gpu-dra", Name: "gpu-dra-controller", Path: ptr.To(Path),
	}}
	whs := Webhooks(driver, cc, admissionregistrationv1.Fail, 5)
	ops := map[string][]admissionregistrationv1.OperationType{}
	for _, wh := range whs {
		// The quota webhook only warns: always Ignore (TestQuotaMatchCondition).
		if wh.Rules[0].Resources[0] == quotasGVR.Resource {
			continue
		}
		if *wh.FailurePolicy != admissionregistrationv1.Fail || *wh.SideEffects != admissionregistrationv1.SideEffectClassNone ||
			!slices.Equal(wh.AdmissionReviewVersions, []string{"v1"}) || *wh.TimeoutSeconds != 5 || *wh.ClientConfig.Service.Path != Path {
			t.Errorf("webhook %s: %+v", wh.Name, wh)
		}
		for _, r := range wh.Rules {
			if !slices.Equal(r.APIGroups, []string{resourceGroup}) {
				t.Errorf("webhook %s: groups %v", wh.Name, r.APIGroups)
			}
			for _, res := range r.Resources {
				ops[res] = append(ops[res], r.Operations...)
			}
		}
	}
	for res := range kinds {
		if len(ops[res]) == 0 {
			t.Errorf("%s handled but not sent to the webhook", res)
		}
	}
	if !slices.Contains(ops["deviceclasses"], admissionregistrationv1.Update) {
		t.Error("DeviceClass updates not validated")
	}
	if slices.Contains(ops["resourceclaims"], admissionregistrationv1.Update) {
		t.Error("claim updates sent: finalizer removal would depend on the webhook")
	}
	for res, o := range ops {
		if slices.Contains(o, admissionregistrationv1.Delete) {
			// The handler does not check deletes, and the matchConditions read object, which is null then.
			t.Errorf("%s deletes sent to the webhook", res)
		}
	}
}
