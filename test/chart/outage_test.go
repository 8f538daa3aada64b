package chart

import (
	"reflect"
	"strings"
	"testing"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// The outage pieces of the chart follow their values: the plugin's Lease
// Role, the admission policy that keeps a plugin to its own node's Lease and
// the heartbeat's priority level exist only with a heartbeat, the
// controller's Lease and DeviceTaintRule permissions only with
// controller.outage.enabled; and the policy spells the Lease name the way
// pkg/vocabulary does.
func TestOutageRenders(t *testing.T) {
	helmBinary(t) // skip (or fail in CI) once, not per case
	// render takes the subtest's t: a Skip or Fatal on the parent's t from a
	// subtest panics instead of skipping.
	render := func(t *testing.T, sets ...string) string {
		t.Helper()
		args := []string{"template", "rel", chartDir, "-n", "ns"}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	policyName := "'" + vocabulary.HeartbeatLeasePrefix + "' + variables.userNodeName"
	for name, tc := range map[string]struct {
		sets          []string
		want, notWant []string
	}{
		"defaults": {
			want: []string{"--heartbeat-period=10s", "name: rel-gpu-dra-driver-heartbeat\n", "name: rel-gpu-dra-driver-heartbeat-leases", policyName,
				"--outage-taints=true", "--outage-grace-period=40s", "--outage-noexecute-after=0s", "resources: [devicetaintrules]",
				"verbs: [list, watch, delete]",
				"--outage-mass-lapse-threshold=0.55", "--outage-mass-lapse-min-nodes=3", "--outage-mass-lapse-taint=true",
				"kind: FlowSchema", "kind: PriorityLevelConfiguration"},
		},
		"no heartbeat": {
			sets:    []string{"kubeletPlugin.heartbeatPeriod=0s"},
			want:    []string{"--heartbeat-period=0s"},
			notWant: []string{"name: rel-gpu-dra-driver-heartbeat\n", "heartbeat-leases", "kind: FlowSchema", "kind: PriorityLevelConfiguration"},
		},
		"heartbeat without its priority level": {
			sets:    []string{"kubeletPlugin.heartbeatPriority.enabled=false"},
			want:    []string{"--heartbeat-period=10s", "name: rel-gpu-dra-driver-heartbeat\n"},
			notWant: []string{"kind: FlowSchema", "kind: PriorityLevelConfiguration"},
		},
		"heartbeat priority tuned": {
			sets: []string{"kubeletPlugin.heartbeatPriority.nominalConcurrencyShares=20", "kubeletPlugin.heartbeatPriority.matchingPrecedence=600"},
			want: []string{"nominalConcurrencyShares: 20\n", "matchingPrecedence: 600\n"},
		},
		"mass lapse: whole cluster, no taint": {
			sets: []string{"controller.outage.massLapse.threshold=1", "controller.outage.massLapse.minNodes=10", "controller.outage.massLapse.taint=false"},
			want: []string{"--outage-mass-lapse-threshold=1\n", "--outage-mass-lapse-min-nodes=10\n", "--outage-mass-lapse-taint=false"},
		},
		"outage off": {
			sets:    []string{"controller.outage.enabled=false"},
			want:    []string{"--outage-taints=false", "heartbeat-leases"},
			notWant: []string{"devicetaintrules", "verbs: [list, watch, delete]"},
		},
		"NoExecute later": {
			sets: []string{"controller.outage.gracePeriod=1m", "controller.outage.noExecuteAfter=10m"},
			want: []string{"--outage-grace-period=1m", "--outage-noexecute-after=10m"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			checkRendered(t, render(t, tc.sets...), tc.want, tc.notWant)
		})
	}
}

// The heartbeat's priority level and FlowSchema, decoded strictly as the API
// types: the schema sends the plugin service account's Lease requests in
// the release namespace, and nothing else, to a Limited level that lends
// and borrows nothing.
func TestHeartbeatPriorityRenders(t *testing.T) {
	out, err := helm(t, "template", "rel", chartDir, "-n", "ns")
	if err != nil {
		t.Fatal(err)
	}
	var fs flowcontrolv1.FlowSchema
	var pl flowcontrolv1.PriorityLevelConfiguration
	for _, doc := range strings.Split(out, "\n---") {
		var into any
		switch {
		case strings.Contains(doc, "\nkind: FlowSchema\n"):
			into = &fs
		case strings.Contains(doc, "\nkind: PriorityLevelConfiguration\n"):
			into = &pl
		default:
			continue
		}
		if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
			t.Fatalf("%v in:\n%s", err, doc)
		}
	}
	if pl.Name == "" || fs.Name == "" {
		t.Fatalf("no heartbeat FlowSchema (%q) or PriorityLevelConfiguration (%q)", fs.Name, pl.Name)
	}
	if l := pl.Spec.Limited; pl.Spec.Type != flowcontrolv1.PriorityLevelEnablementLimited || l == nil || ptr.Deref(l.NominalConcurrencyShares, 0) != 5 ||
		ptr.Deref(l.LendablePercent, -1) != 0 || ptr.Deref(l.BorrowingLimitPercent, -1) != 0 {
		t.Errorf("priority level %s: %+v, want Limited, 5 shares, nothing lent or borrowed", pl.Name, pl.Spec)
	}
	sa := pluginDaemonSet(t, out).Spec.Template.Spec.ServiceAccountName
	want := []flowcontrolv1.PolicyRulesWithSubjects{{
		Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindServiceAccount,
			ServiceAccount: &flowcontrolv1.ServiceAccountSubject{Name: sa, Namespace: "ns"}}},
		ResourceRules: []flowcontrolv1.ResourcePolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			Verbs: []string{"get", "create", "update", "patch"}, Namespaces: []string{"ns"}}},
	}}
	if fs.Spec.PriorityLevelConfiguration.Name != pl.Name || fs.Spec.MatchingPrecedence != 1000 || !reflect.DeepEqual(fs.Spec.Rules, want) {
		t.Errorf("FlowSchema %s: %+v, want level %s, precedence 1000, rules %+v", fs.Name, fs.Spec, pl.Name, want)
	}
}
