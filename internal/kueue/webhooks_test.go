package kueue

import (
	"encoding/base64"
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestWebhooksCallTheHostProcess(t *testing.T) {
	manifests, err := os.ReadFile("testdata/webhooks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Webhooks(manifests, "https://127.0.0.1:19443", []byte("CA"), "gdd-kueue")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string][]string{}
	for _, cfg := range got {
		hooks, _, _ := unstructured.NestedSlice(cfg.Object, "webhooks")
		for _, h := range hooks {
			hook := h.(map[string]any)
			name := hook["name"].(string)
			names[cfg.GetName()] = append(names[cfg.GetName()], name)
			url, _, _ := unstructured.NestedString(hook, "clientConfig", "url")
			ca, _, _ := unstructured.NestedString(hook, "clientConfig", "caBundle")
			if !strings.HasPrefix(url, "https://127.0.0.1:19443/") || strings.Contains(url, "//mutate") {
				t.Errorf("%s: url %q", name, url)
			}
			if _, svc, _ := unstructured.NestedMap(hook, "clientConfig", "service"); svc {
				t.Errorf("%s still calls a Service", name)
			}
			if ca != base64.StdEncoding.EncodeToString([]byte("CA")) {
				t.Errorf("%s: caBundle %q", name, ca)
			}
			_, selected, _ := unstructured.NestedSlice(hook, "objectSelector", "matchExpressions")
			if isJob := strings.HasSuffix(name, "job.kb.io"); selected != isJob {
				t.Errorf("%s: objectSelector set = %v, want %v (only Job webhooks select queued objects)", name, selected, isJob)
			}
		}
	}
	want := map[string][]string{
		"gdd-kueue-mutating":   {"mclusterqueue.kb.io", "mjob.kb.io"},
		"gdd-kueue-validating": {"vclusterqueue.kb.io", "vjob.kb.io"},
	}
	for cfg, hooks := range want {
		if strings.Join(names[cfg], ",") != strings.Join(hooks, ",") {
			t.Errorf("%s has webhooks %v, want %v (no pod webhook: that integration is off)", cfg, names[cfg], hooks)
		}
	}
	if len(names) != len(want) {
		t.Errorf("configurations %v, want %v", names, want)
	}
}

func TestWebhooksRefuse(t *testing.T) {
	for name, tc := range map[string]struct{ manifests, want string }{
		"other kind": {"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "unexpected kind"},
		"empty":      {"# nothing\n", "no webhook configuration"},
		"no path": {`apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: m}
webhooks:
- name: mjob.kb.io
  clientConfig: {service: {name: s, namespace: n}}
  rules: [{apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}]
`, "no clientConfig.service.path"},
		"only pods": {`apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: m}
webhooks:
- name: mpod.kb.io
  clientConfig: {service: {name: s, namespace: n, path: /mutate--v1-pod}}
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
`, "no webhook for"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Webhooks([]byte(tc.manifests), "https://127.0.0.1:1", nil, "p")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
