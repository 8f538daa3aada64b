package chart

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// TestReservePolicyRenders: devicePolicy.reserve, and a node group's
// policy.reserve, reach the plugin's device policy as the plugin reads it,
// and only then may the plugin list and watch ResourceClaims.
func TestReservePolicyRenders(t *testing.T) {
	const main = "rel-gpu-dra-driver-kubelet-plugin-policy"
	for name, tc := range map[string]struct {
		args  []string
		spare map[string]int // ConfigMap name → reserve.spareGPUs
		watch bool
	}{
		"off":         {spare: map[string]int{main: 0}},
		"zero is off": {args: []string{"--set", "devicePolicy.reserve.spareGPUs=0"}, spare: map[string]int{main: 0}},
		"default":     {args: []string{"--set", "devicePolicy.reserve.spareGPUs=1"}, spare: map[string]int{main: 1}, watch: true},
		"one node group": {
			args: []string{"--set", "devicePolicy.nodeGroups[0].name=mig", "--set", "devicePolicy.nodeGroups[0].nodeSelector.pool=mig",
				"--set", "devicePolicy.nodeGroups[0].policy.reserve.spareGPUs=2"},
			spare: map[string]int{main: 0, "rel-gpu-dra-driver-kubelet-plugin-mig-policy": 2}, watch: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := helm(t, append([]string{"template", "rel", chartDir, "-n", "ns"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			policies := map[string]int{}
			var verbs []string
			for _, doc := range strings.Split(out, "\n---") {
				switch {
				case strings.Contains(doc, "\nkind: ConfigMap\n") && strings.Contains(doc, "device-policy.yaml"):
					var cm corev1.ConfigMap
					if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
						t.Fatal(err)
					}
					file := filepath.Join(t.TempDir(), "policy.yaml")
					if err := os.WriteFile(file, []byte(cm.Data["device-policy.yaml"]), 0o600); err != nil {
						t.Fatal(err)
					}
					p, err := devicemodel.LoadPolicy(file)
					if err != nil {
						t.Fatalf("ConfigMap %s: %v", cm.Name, err)
					}
					policies[cm.Name] = p.Reserve.SpareGPUs
				case strings.Contains(doc, "\nkind: ClusterRole\n") && strings.Contains(doc, "-kubelet-plugin\n"):
					var role rbacv1.ClusterRole
					if err := yaml.Unmarshal([]byte(doc), &role); err != nil {
						t.Fatal(err)
					}
					for _, r := range role.Rules {
						if len(r.Resources) == 1 && r.Resources[0] == "resourceclaims" {
							verbs = r.Verbs
						}
					}
				}
			}
			if len(policies) != len(tc.spare) {
				t.Fatalf("device policies %v, want %v", policies, tc.spare)
			}
			for suffix, want := range tc.spare {
				if got, ok := policies[suffix]; !ok || got != want {
					t.Errorf("device policy %q: reserve.spareGPUs %d, want %d (all: %v)", suffix, got, want, policies)
				}
			}
			watches := strings.Contains(strings.Join(verbs, ","), "watch")
			if watches != tc.watch || !strings.Contains(strings.Join(verbs, ","), "get") {
				t.Errorf("kubelet plugin's verbs on resourceclaims %v, want list and watch: %v", verbs, tc.watch)
			}
		})
	}
}
