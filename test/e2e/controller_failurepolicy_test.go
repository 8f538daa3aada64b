package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// TestControllerWebhookFailurePolicy: during an outage of the chart's webhook
// (controller.replicas=0: its Service has no endpoints) the API server applies
// controller.webhook.failurePolicy. With Fail, creating claims and templates
// is refused with "failed calling webhook"; with Ignore, they are admitted,
// invalid configs too (they then fail at prepare). The chart's webhook has no
// matchConditions, so claims without our config are sent to it as well and
// share that fate (docs/controller.md: under Fail, new claims are refused
// while no replica is ready).
func TestControllerWebhookFailurePolicy(t *testing.T) {
	ctx := testContext(t)
	ns := newNamespace(t, ctx, "e2e-webhook-outage")
	saveRelease(t, ctx)
	valid, invalid := admissionCase(t, "mps-50"), admissionCase(t, invalidCase)
	claims := env.cluster.Client.ResourceV1().ResourceClaims(ns)
	create := map[string]func(ctx context.Context, name string, opts metav1.CreateOptions) error{
		"claim with our valid config": func(ctx context.Context, name string, opts metav1.CreateOptions) error {
			claim := caseClaim(t, valid, ns)
			claim.Name = name
			_, err := claims.Create(ctx, claim, opts)
			return err
		},
		"claim with our invalid config": func(ctx context.Context, name string, opts metav1.CreateOptions) error {
			claim := caseClaim(t, invalid, ns)
			claim.Name = name
			_, err := claims.Create(ctx, claim, opts)
			return err
		},
		"claim without config": func(ctx context.Context, name string, opts metav1.CreateOptions) error {
			claim := caseClaim(t, valid, ns)
			claim.Name, claim.Spec.Devices.Config = name, nil
			_, err := claims.Create(ctx, claim, opts)
			return err
		},
		"template with our valid config": func(ctx context.Context, name string, opts metav1.CreateOptions) error {
			tmpl := &resourceapi.ResourceClaimTemplate{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: caseClaim(t, valid, ns).Spec},
			}
			_, err := env.cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, opts)
			return err
		},
	}
	failedCalling := `failed calling webhook "claims.` + driverName + `"`

	for _, policy := range []admissionregistrationv1.FailurePolicyType{admissionregistrationv1.Fail, admissionregistrationv1.Ignore} {
		upgradeRelease(t, ctx, "--set", "controller.replicas=0", "--set", "controller.webhook.failurePolicy="+string(policy))
		checkWebhookConfiguration(t, ctx, policy)
		refused := policy == admissionregistrationv1.Fail

		// The API server notices the gone endpoints and the new policy within
		// moments; wait for that with a dry run.
		probe := create["claim with our valid config"]
		if !refused {
			probe = create["claim with our invalid config"]
		}
		var last error
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			last = probe(ctx, "probe", metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if refused {
				return last != nil && strings.Contains(last.Error(), failedCalling), nil
			}
			return last == nil, nil
		})
		if err != nil {
			t.Fatalf("failurePolicy %s: the API server does not apply it: %v; last create: %v", policy, err, last)
		}

		for what, do := range create {
			name := strings.ReplaceAll(what, " ", "-") + "-" + strings.ToLower(string(policy))
			err := do(ctx, name, metav1.CreateOptions{})
			switch {
			case refused && err == nil:
				t.Errorf("failurePolicy Fail, webhook unreachable: %s admitted", what)
			case refused && !strings.Contains(err.Error(), failedCalling):
				t.Errorf("failurePolicy Fail, webhook unreachable: %s refused, but not for the webhook: %v", what, err)
			case !refused && err != nil:
				t.Errorf("failurePolicy Ignore, webhook unreachable: %s refused: %v", what, err)
			default:
				t.Logf("failurePolicy %s, webhook unreachable: %s: %v", policy, what, errOrAdmitted(err))
			}
		}
	}
}

// checkWebhookConfiguration checks the live webhook configuration of the
// release: the failurePolicy the chart was given, and no matchConditions (the
// test's expectation for claims without our config rests on that).
func checkWebhookConfiguration(t *testing.T, ctx context.Context, policy admissionregistrationv1.FailurePolicyType) {
	t.Helper()
	name := controllerArg(t, ctx, "webhook-configuration-name")
	vwc, err := env.cluster.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, wh := range vwc.Webhooks {
		if wh.FailurePolicy == nil || *wh.FailurePolicy != policy {
			t.Fatalf("webhook %s: failurePolicy %v, want %s", wh.Name, wh.FailurePolicy, policy)
		}
		if len(wh.MatchConditions) > 0 {
			t.Fatalf("webhook %s has matchConditions now (%v): claims without our config may no longer reach it; update this test", wh.Name, wh.MatchConditions)
		}
	}
}

func errOrAdmitted(err error) string {
	if err == nil {
		return "admitted"
	}
	return err.Error()
}
