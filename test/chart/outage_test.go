package chart

import (
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// The outage pieces of the chart follow their values: the plugin's Lease
// Role and the admission policy that keeps a plugin to its own node's Lease
// exist only with a heartbeat, the controller's Lease and DeviceTaintRule
// permissions only with controller.outage.enabled; and the policy spells the
// Lease name the way pkg/vocabulary does.
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
				"verbs: [list, watch, delete]"},
		},
		"no heartbeat": {
			sets:    []string{"kubeletPlugin.heartbeatPeriod=0s"},
			want:    []string{"--heartbeat-period=0s"},
			notWant: []string{"name: rel-gpu-dra-driver-heartbeat\n", "heartbeat-leases"},
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
