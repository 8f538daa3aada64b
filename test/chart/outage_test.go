package chart

import (
	"strings"
	"testing"

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
	// render takes the subtest's t: a skip or failure is the subtest's.
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
				heartbeatPriorityLevel, heartbeatPriorityLevelSpec, heartbeatFlowSchema},
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
			out := render(t, tc.sets...)
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("rendered chart lacks %q", w)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out, w) {
					t.Errorf("rendered chart has %q", w)
				}
			}
		})
	}
}

// The heartbeat's level and schema as rendered with the defaults: Limited,
// a small share, nothing lent or borrowed; the plugin's service account's
// Lease requests in the release namespace only.
const (
	heartbeatPriorityLevel = `kind: PriorityLevelConfiguration
metadata:
  name: rel-gpu-dra-driver-heartbeat
  labels:`
	heartbeatPriorityLevelSpec = `spec:
  type: Limited
  limited:
    nominalConcurrencyShares: 5
    lendablePercent: 0
    borrowingLimitPercent: 0
`
	heartbeatFlowSchema = `spec:
  priorityLevelConfiguration:
    name: rel-gpu-dra-driver-heartbeat
  matchingPrecedence: 1000
  distinguisherMethod:
    type: ByUser
  rules:
  - subjects:
    - kind: ServiceAccount
      serviceAccount:
        name: rel-gpu-dra-driver-kubelet-plugin
        namespace: ns
    resourceRules:
    - apiGroups: [coordination.k8s.io]
      resources: [leases]
      verbs: [get, create, update, patch]
      namespaces: [ns]
`
)
