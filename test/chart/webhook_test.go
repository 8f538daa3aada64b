package chart

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/webhook"
)

// The chart's webhook configuration is the one pkg/controller/webhook
// defines, under either failurePolicy: in particular the ResourceQuota rule
// (CREATE, UPDATE) exists, and stays Ignore under Fail, since it only warns.
func TestChartWebhooks(t *testing.T) {
	helmBinary(t) // skip (or fail in CI) once, not per case
	for _, policy := range []admissionregistrationv1.FailurePolicyType{admissionregistrationv1.Fail, admissionregistrationv1.Ignore} {
		t.Run(string(policy), func(t *testing.T) {
			out, err := helm(t, "template", "rel", chartDir, "-n", "ns", "--set", "controller.webhook.failurePolicy="+string(policy))
			if err != nil {
				t.Fatal(err)
			}
			var vwc *admissionregistrationv1.ValidatingWebhookConfiguration
			for _, doc := range strings.Split(out, "\n---") {
				if !strings.Contains(doc, "\nkind: ValidatingWebhookConfiguration\n") {
					continue
				}
				vwc = &admissionregistrationv1.ValidatingWebhookConfiguration{}
				if err := yaml.UnmarshalStrict([]byte(doc), vwc); err != nil {
					t.Fatalf("%v in:\n%s", err, doc)
				}
			}
			if vwc == nil {
				t.Fatal("the chart renders no ValidatingWebhookConfiguration")
			}
			want := webhook.Webhooks("gpu.dra.dev", admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: "ns", Name: "rel-gpu-dra-driver-controller", Path: ptr.To(webhook.Path), Port: ptr.To[int32](443)},
			}, policy, 10)
			if diff := cmp.Diff(want, vwc.Webhooks); diff != "" {
				t.Errorf("chart webhooks differ from pkg/controller/webhook.Webhooks (-want +got):\n%s", diff)
			}
			i := len(vwc.Webhooks) - 1
			if wh := vwc.Webhooks[i]; wh.Name != "resourcequotas.gpu.dra.dev" || ptr.Deref(wh.FailurePolicy, "") != admissionregistrationv1.Ignore {
				t.Errorf("last webhook %s, failurePolicy %v: want resourcequotas.gpu.dra.dev under Ignore", wh.Name, ptr.Deref(wh.FailurePolicy, ""))
			}
		})
	}
}

// The chart's MutatingWebhookConfiguration (request translation) is the one
// pkg/controller/webhook.MutatingWebhooks defines for the chart's scheduler
// list, and is not rendered when the list is empty; its RBAC comes with it.
func TestChartMutatingWebhooks(t *testing.T) {
	helmBinary(t)
	tests := map[string]struct {
		args       []string
		schedulers []string
		policy     admissionregistrationv1.FailurePolicyType
	}{
		"default":         {schedulers: []string{"volcano"}, policy: admissionregistrationv1.Fail},
		"two, Ignore":     {args: []string{"--set", "controller.requestTranslation.schedulers={volcano,kai-scheduler}", "--set", "controller.requestTranslation.failurePolicy=Ignore"}, schedulers: []string{"volcano", "kai-scheduler"}, policy: admissionregistrationv1.Ignore},
		"off":             {args: []string{"--set-json", "controller.requestTranslation.schedulers=[]"}},
		"off by null":     {args: []string{"--set", "controller.requestTranslation.schedulers=null"}},
		"webhook off too": {args: []string{"--set", "controller.webhook.enabled=false"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := helm(t, append([]string{"template", "rel", chartDir, "-n", "ns"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			var mwc *admissionregistrationv1.MutatingWebhookConfiguration
			for _, doc := range strings.Split(out, "\n---") {
				if !strings.Contains(doc, "\nkind: MutatingWebhookConfiguration\n") {
					continue
				}
				mwc = &admissionregistrationv1.MutatingWebhookConfiguration{}
				if err := yaml.UnmarshalStrict([]byte(doc), mwc); err != nil {
					t.Fatalf("%v in:\n%s", err, doc)
				}
			}
			rbac := strings.Contains(out, "resources: [resourceclaimtemplates]\n  verbs: [get, create]")
			if len(tc.schedulers) == 0 {
				if mwc != nil || rbac {
					t.Errorf("translation off, but MutatingWebhookConfiguration %v, template RBAC %v", mwc != nil, rbac)
				}
				return
			}
			if mwc == nil || mwc.Name != "rel-gpu-dra-driver-request-translation" || !rbac {
				t.Fatalf("MutatingWebhookConfiguration %+v, template RBAC %v", mwc, rbac)
			}
			want := webhook.MutatingWebhooks("gpu.dra.dev", tc.schedulers, admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: "ns", Name: "rel-gpu-dra-driver-controller", Path: ptr.To(webhook.MutatePath), Port: ptr.To[int32](443)},
			}, tc.policy, 10)
			if diff := cmp.Diff(want, mwc.Webhooks); diff != "" {
				t.Errorf("chart webhooks differ from pkg/controller/webhook.MutatingWebhooks (-want +got):\n%s", diff)
			}
			// Volcano Queues are translated too (quota per DeviceClass), on
			// update as well, and they are cluster-scoped.
			if n := len(mwc.Webhooks); n != 3 || mwc.Webhooks[2].Name != "queues.translate.gpu.dra.dev" ||
				ptr.Deref(mwc.Webhooks[2].Rules[0].Scope, "") != admissionregistrationv1.ClusterScope || len(mwc.Webhooks[2].Rules[0].Operations) != 2 {
				t.Errorf("want the queues webhook third, cluster-scoped, on CREATE and UPDATE: %+v", mwc.Webhooks)
			}
			for _, arg := range []string{"--request-translation-schedulers=" + strings.Join(tc.schedulers, ","), "--mutating-webhook-configuration-name=rel-gpu-dra-driver-request-translation"} {
				if !strings.Contains(out, "- "+arg+"\n") {
					t.Errorf("controller args lack %s", arg)
				}
			}
		})
	}
}

// The extended resource names the chart's DeviceClasses serve beyond the
// device plugin's reach the controller (--quota-resource-names) and the
// quota webhook's matchCondition, exactly as pkg/controller/webhook renders
// them for those names: a quota limiting example.com/gpu without requests.
// is warned about like one limiting nvidia.com/gpu. Device plugin names are
// left to the fixed pattern, so the default render carries no list.
func TestChartQuotaResourceNames(t *testing.T) {
	helmBinary(t)
	for name, tc := range map[string]struct {
		sets     []string
		wantFlag string   // "": no --quota-resource-names
		served   []string // what the classes serve, given to webhook.Webhooks
	}{
		"defaults":            {served: []string{"nvidia.com/gpu"}},
		"device plugin names": {sets: []string{"extendedResources.timeslice=nvidia.com/gpu.shared", "extendedResources.migProfiles={1g.10gb}"}},
		"names of other domains": {
			sets:     []string{"extendedResourceName=example.com/gpu", "extendedResources.mps=example.com/mps", "extendedResources.timeslice=nvidia.com/gpu.shared"},
			wantFlag: "--quota-resource-names=example.com/gpu,example.com/mps",
			served:   []string{"example.com/gpu", "nvidia.com/gpu.shared", "example.com/mps"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var args []string
			for _, s := range tc.sets {
				args = append(args, "--set", s)
			}
			r := renderObjects(t, args...)
			var flags []string
			for _, a := range r.args["controller"] {
				if strings.HasPrefix(a, "--quota-resource-names") {
					flags = append(flags, a)
				}
			}
			if want := []string{tc.wantFlag}; (tc.wantFlag == "" && len(flags) > 0) || (tc.wantFlag != "" && !slices.Equal(flags, want)) {
				t.Errorf("controller flags %q, want %q", flags, tc.wantFlag)
			}
			want := webhook.Webhooks("gpu.dra.dev", admissionregistrationv1.WebhookClientConfig{
				Service: &admissionregistrationv1.ServiceReference{Namespace: "ns", Name: "rel-gpu-dra-driver-controller", Path: ptr.To(webhook.Path), Port: ptr.To[int32](443)},
			}, admissionregistrationv1.Fail, 10, tc.served...)
			if diff := cmp.Diff(want, r.webhooks); diff != "" {
				t.Errorf("chart webhooks differ from pkg/controller/webhook.Webhooks (-want +got):\n%s", diff)
			}
		})
	}
}
