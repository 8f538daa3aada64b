package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/controller/webhook"
)

// TestControllerWebhookFailurePolicy: during an outage of the chart's webhook
// (controller.replicas=0: its Service has no endpoints) the API server applies
// controller.webhook.failurePolicy to the objects the webhook's
// matchConditions select, those with an opaque config for our driver. With
// Fail, creating such claims, templates and DeviceClasses is refused with
// "failed calling webhook"; with Ignore, they are admitted, invalid configs
// too (they then fail at prepare). Objects without config, or with only
// another driver's, never reach the webhook and are admitted under either
// policy. The release's cleanup waits until the webhook rejects an invalid
// claim with the field's message again.
func TestControllerWebhookFailurePolicy(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx, "e2e-webhook-outage")
	saveRelease(t, ctx)
	valid, invalid := "mps-50", invalidCase
	otherDriver := func(c *resourceapi.ResourceClaim) {
		c.Spec.Devices.Config[0].Opaque = &resourceapi.OpaqueDeviceConfiguration{
			Driver: "nic.example.com", Parameters: runtime.RawExtension{Raw: []byte(`{"mtu":9000}`)},
		}
	}
	noConfig := func(c *resourceapi.ResourceClaim) { c.Spec.Devices.Config = nil }
	claims := env.cluster.Client.ResourceV1().ResourceClaims(ns)
	templates := env.cluster.Client.ResourceV1().ResourceClaimTemplates(ns)
	// edited is the claim of the admission case c, changed by edit.
	edited := func(c string, edit func(*resourceapi.ResourceClaim)) *resourceapi.ResourceClaim {
		claim := caseClaim(t, admissionCase(t, c), ns)
		if edit != nil {
			edit(claim)
		}
		return claim
	}
	type createFunc func(ctx context.Context, name string, opts metav1.CreateOptions) error
	claim := func(c string, edit func(*resourceapi.ResourceClaim)) createFunc {
		return func(ctx context.Context, name string, opts metav1.CreateOptions) error {
			claim := edited(c, edit)
			claim.Name = name
			_, err := claims.Create(ctx, claim, opts)
			return err
		}
	}
	template := func(c string, edit func(*resourceapi.ResourceClaim)) createFunc {
		return func(ctx context.Context, name string, opts metav1.CreateOptions) error {
			_, err := templates.Create(ctx, &resourceapi.ResourceClaimTemplate{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: edited(c, edit).Spec},
			}, opts)
			return err
		}
	}
	// class dry-runs a DeviceClass with the claim's configs: classes are
	// cluster-scoped, and a dry run goes through admission too.
	class := func(c string, edit func(*resourceapi.ResourceClaim)) createFunc {
		return func(ctx context.Context, name string, opts metav1.CreateOptions) error {
			dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name + ".e2e.example.com"}}
			for _, cfg := range edited(c, edit).Spec.Devices.Config {
				dc.Spec.Config = append(dc.Spec.Config, resourceapi.DeviceClassConfiguration{DeviceConfiguration: cfg.DeviceConfiguration})
			}
			opts.DryRun = []string{metav1.DryRunAll}
			_, err := env.cluster.Client.ResourceV1().DeviceClasses().Create(ctx, dc, opts)
			return err
		}
	}
	cases := map[string]struct {
		// webhook is the webhook that gets the object, "" for none.
		webhook string
		create  createFunc
	}{
		"claim with our valid config":              {webhook: "claims", create: claim(valid, nil)},
		"claim with our invalid config":            {webhook: "claims", create: claim(invalid, nil)},
		"claim without config":                     {create: claim(valid, noConfig)},
		"claim with another driver's config":       {create: claim(valid, otherDriver)},
		"template with our valid config":           {webhook: "claims", create: template(valid, nil)},
		"template with our invalid config":         {webhook: "claims", create: template(invalid, nil)},
		"template without config":                  {create: template(valid, noConfig)},
		"template with another driver's config":    {create: template(valid, otherDriver)},
		"deviceclass with our invalid config":      {webhook: "deviceclasses", create: class(invalid, nil)},
		"deviceclass without config":               {create: class(valid, noConfig)},
		"deviceclass with another driver's config": {create: class(valid, otherDriver)},
	}
	failedCalling := func(wh string) string { return `failed calling webhook "` + wh + "." + driverName + `"` }

	for _, policy := range []admissionregistrationv1.FailurePolicyType{admissionregistrationv1.Fail, admissionregistrationv1.Ignore} {
		upgradeRelease(t, ctx, "--set", "controller.replicas=0", "--set", "controller.webhook.failurePolicy="+string(policy))
		checkWebhookConfiguration(t, ctx, policy)
		fail := policy == admissionregistrationv1.Fail

		// The API server notices the gone endpoints and the new policy within
		// moments; wait for that with a dry run.
		probe := cases["claim with our valid config"].create
		if !fail {
			probe = cases["claim with our invalid config"].create
		}
		var last error
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			last = probe(ctx, "probe", metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if fail {
				return last != nil && strings.Contains(last.Error(), failedCalling("claims")), nil
			}
			return last == nil, nil
		})
		if err != nil {
			t.Fatalf("failurePolicy %s: the API server does not apply it: %v; last create: %v", policy, err, last)
		}

		for what, c := range cases {
			name := strings.ReplaceAll(strings.ReplaceAll(what, " ", "-"), "'", "") + "-" + strings.ToLower(string(policy))
			err := c.create(ctx, name, metav1.CreateOptions{})
			refused := fail && c.webhook != ""
			switch {
			case refused && err == nil:
				t.Errorf("failurePolicy Fail, webhook unreachable: %s admitted", what)
			case refused && !strings.Contains(err.Error(), failedCalling(c.webhook)):
				t.Errorf("failurePolicy Fail, webhook unreachable: %s refused, but not for the webhook: %v", what, err)
			case !refused && err != nil:
				t.Errorf("failurePolicy %s, webhook unreachable: %s refused: %v", policy, what, err)
			default:
				t.Logf("failurePolicy %s, webhook unreachable: %s: %v", policy, what, errOrAdmitted(err))
			}
		}
	}
}

// checkWebhookConfiguration checks the live webhook configuration of the
// release: the failurePolicy the chart was given, and the matchConditions of
// pkg/controller/webhook, on which the test's expectations for objects
// without our config rest.
func checkWebhookConfiguration(t *testing.T, ctx context.Context, policy admissionregistrationv1.FailurePolicyType) {
	t.Helper()
	name := controllerArg(t, ctx, "webhook-configuration-name")
	vwc, err := env.cluster.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]admissionregistrationv1.ValidatingWebhook{}
	for _, wh := range webhook.Webhooks(driverName, admissionregistrationv1.WebhookClientConfig{}, policy, 0) {
		want[wh.Name] = wh
	}
	if len(vwc.Webhooks) != len(want) {
		t.Fatalf("webhook configuration %s has %d webhooks, want %d", name, len(vwc.Webhooks), len(want))
	}
	for _, wh := range vwc.Webhooks {
		// The ResourceQuota webhook only warns: Ignore under either policy.
		if got, wantPolicy := ptr.Deref(wh.FailurePolicy, ""), ptr.Deref(want[wh.Name].FailurePolicy, ""); got == "" || got != wantPolicy {
			t.Fatalf("webhook %s: failurePolicy %q, want %q", wh.Name, got, wantPolicy)
		}
		if diff := cmp.Diff(want[wh.Name].MatchConditions, wh.MatchConditions); diff != "" {
			t.Fatalf("webhook %s: matchConditions differ from pkg/controller/webhook (-want +got):\n%s", wh.Name, diff)
		}
	}
}

func errOrAdmitted(err error) string {
	if err == nil {
		return "admitted"
	}
	return err.Error()
}
