package kueue

import (
	"encoding/base64"
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpu-dra/gpu-dra-driver/internal/scenarios"
)

// QueueNameLabel is the label that puts a Job in a Kueue LocalQueue.
const QueueNameLabel = "kueue.x-k8s.io/queue-name"

// webhookGroups are the API groups whose Kueue webhooks are registered: the
// batch/v1 Job integration and Kueue's own objects. Kueue serves only the
// integrations it is configured with; a webhook of another (pods, JobSets,
// Ray...) with failurePolicy Fail would refuse those objects cluster-wide.
var webhookGroups = []string{"batch", "kueue.x-k8s.io"}

// Webhooks turns Kueue's webhook configurations (config/webhooks.yaml: the
// kustomize base, calling a Service) into ones that call the manager at url
// (https://127.0.0.1:<port>, a host process like the rest of the control plane)
// trusting caPEM, keeping the webhooks of webhookGroups. Job webhooks see only
// Jobs with QueueNameLabel, so a Job outside Kueue never waits on it. The
// configurations are named prefix-<kind>.
func Webhooks(manifests []byte, url string, caPEM []byte, prefix string) ([]*unstructured.Unstructured, error) {
	objs, err := scenarios.DecodeObjects(manifests)
	if err != nil {
		return nil, fmt.Errorf("webhook manifests: %w", err)
	}
	var out []*unstructured.Unstructured
	for _, u := range objs {
		obj := u.Object
		kind := u.GetKind()
		if kind != "MutatingWebhookConfiguration" && kind != "ValidatingWebhookConfiguration" {
			return nil, fmt.Errorf("webhook manifests: unexpected kind %q", kind)
		}
		hooks, _, err := unstructured.NestedSlice(obj, "webhooks")
		if err != nil {
			return nil, fmt.Errorf("%s %s: webhooks: %w", kind, u.GetName(), err)
		}
		var kept []any
		for i, h := range hooks {
			hook, ok := h.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%s %s: webhooks[%d] is not an object", kind, u.GetName(), i)
			}
			groups, err := ruleGroups(hook)
			if err != nil {
				return nil, fmt.Errorf("%s %s: webhooks[%d]: %w", kind, u.GetName(), i, err)
			}
			if !subset(groups, webhookGroups) {
				continue
			}
			path, _, err := unstructured.NestedString(hook, "clientConfig", "service", "path")
			if err != nil || path == "" {
				return nil, fmt.Errorf("%s %s: webhooks[%d]: no clientConfig.service.path", kind, u.GetName(), i)
			}
			hook["clientConfig"] = map[string]any{"url": url + path, "caBundle": base64.StdEncoding.EncodeToString(caPEM)}
			if slices.Equal(groups, []string{"batch"}) {
				hook["objectSelector"] = map[string]any{"matchExpressions": []any{
					map[string]any{"key": QueueNameLabel, "operator": "Exists"},
				}}
			}
			kept = append(kept, hook)
		}
		if len(kept) == 0 {
			return nil, fmt.Errorf("%s %s: no webhook for %v", kind, u.GetName(), webhookGroups)
		}
		u.Object["webhooks"] = kept
		u.SetName(prefix + "-" + map[string]string{"MutatingWebhookConfiguration": "mutating", "ValidatingWebhookConfiguration": "validating"}[kind])
		out = append(out, u)
	}
	if len(out) == 0 {
		return nil, errors.New("webhook manifests: no webhook configuration")
	}
	return out, nil
}

// ruleGroups lists the API groups of a webhook's rules, sorted, once each.
func ruleGroups(hook map[string]any) ([]string, error) {
	rules, _, err := unstructured.NestedSlice(hook, "rules")
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	var groups []string
	for i, r := range rules {
		rule, ok := r.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("rules[%d] is not an object", i)
		}
		g, _, err := unstructured.NestedStringSlice(rule, "apiGroups")
		if err != nil {
			return nil, fmt.Errorf("rules[%d].apiGroups: %w", i, err)
		}
		groups = append(groups, g...)
	}
	if len(groups) == 0 {
		return nil, errors.New("no rules with apiGroups")
	}
	slices.Sort(groups)
	return slices.Compact(groups), nil
}

func subset(a, of []string) bool {
	for _, x := range a {
		if !slices.Contains(of, x) {
			return false
		}
	}
	return true
}
