package v1beta1

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// crdSchema follows path (property names) from the CRD's v1beta1 schema.
func crdSchema(t *testing.T, crd map[string]any, path ...string) map[string]any {
	t.Helper()
	versions := crd["spec"].(map[string]any)["versions"].([]any)
	node := versions[0].(map[string]any)["schema"].(map[string]any)["openAPIV3Schema"].(map[string]any)
	for _, p := range path {
		if items, ok := node["items"].(map[string]any); ok {
			node = items
		}
		next, ok := node["properties"].(map[string]any)[p].(map[string]any)
		if !ok {
			t.Fatalf("CRD schema has no %v", path)
		}
		node = next
	}
	return node
}

func enum(node map[string]any) []string {
	var out []string
	for _, v := range node["enum"].([]any) {
		out = append(out, fmt.Sprint(v))
	}
	return out
}

func asStrings[T ~string](values []T) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = string(v)
	}
	return out
}

// The CRD accepts what Validate accepts: the same enums, defaults and bounds.
func TestComputeDomainCRD(t *testing.T) {
	data, err := os.ReadFile("../../../deployments/crds/gpu.dra.dev_computedomains.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	spec := crd["spec"].(map[string]any)
	versions := spec["versions"].([]any)
	if spec["group"] != GroupName || len(versions) != 1 || versions[0].(map[string]any)["name"] != Version ||
		spec["names"].(map[string]any)["kind"] != ComputeDomainKind {
		t.Fatalf("CRD is for %v %v, want %s/%s %s", spec["group"], spec["names"], GroupName, Version, ComputeDomainKind)
	}
	mode := crdSchema(t, crd, "spec", "channel", "allocationMode")
	if got := enum(mode); !slices.Equal(got, asStrings(channelAllocationModes)) || mode["default"] != string(SingleChannel) {
		t.Errorf("allocationMode enum %v default %v", got, mode["default"])
	}
	channel := crdSchema(t, crd, "spec", "channel")
	if _, required := channel["required"]; required {
		t.Errorf("spec.channel requires %v; it needs exactly one of its two names", channel["required"])
	}
	rules := fmt.Sprint(channel["x-kubernetes-validations"])
	for _, f := range []string{"resourceClaimName", "resourceClaimTemplateName"} {
		if node := crdSchema(t, crd, "spec", "channel", f); node["maxLength"] != float64(253) {
			t.Errorf("%s maxLength %v, want 253 (a DNS subdomain)", f, node["maxLength"])
		}
		if !strings.Contains(rules, "has(self."+f+")") {
			t.Errorf("spec.channel's rules %s do not check %s", rules, f)
		}
	}
	if ch := crdSchema(t, crd, "status", "channel"); ch["type"] != "integer" || ch["minimum"] != float64(0) {
		t.Errorf("status.channel %v, want a non-negative integer", ch)
	}
	policy := crdSchema(t, crd, "spec", "lifetime", "policy")
	if got := enum(policy); !slices.Equal(got, asStrings(lifetimePolicies)) || policy["default"] != string(LifetimeWithOwner) {
		t.Errorf("policy enum %v default %v", got, policy["default"])
	}
	g := crdSchema(t, crd, "spec", "lifetime", "gracePeriodSeconds")
	if g["minimum"] != float64(0) || g["maximum"] != float64(MaxGracePeriodSeconds) {
		t.Errorf("gracePeriodSeconds bounds %v..%v", g["minimum"], g["maximum"])
	}
	states := []DaemonState{DaemonStarting, DaemonConnected, DaemonDisconnected, DaemonFailed}
	if got := enum(crdSchema(t, crd, "status", "nodes", "daemon", "state")); !slices.Equal(got, asStrings(states)) {
		t.Errorf("daemon state enum %v", got)
	}
}

// The chart installs the same CRD (Helm installs crds/ before the
// templates and never upgrades it): both copies must stay equal.
func TestChartComputeDomainCRD(t *testing.T) {
	want, err := os.ReadFile("../../../deployments/crds/gpu.dra.dev_computedomains.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../../deployments/helm/gpu-dra-driver/crds/gpu.dra.dev_computedomains.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Error("deployments/helm/gpu-dra-driver/crds/gpu.dra.dev_computedomains.yaml differs from deployments/crds/: copy it over")
	}
}
