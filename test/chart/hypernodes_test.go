package chart

import (
	"strings"
	"testing"
)

// The controller's HyperNode permissions and flag follow
// controller.volcanoHyperNodes (default on).
func TestHyperNodesRenders(t *testing.T) {
	helmBinary(t)
	for name, tc := range map[string]struct {
		sets          []string
		want, notWant []string
	}{
		"defaults": {want: []string{"--volcano-hypernodes=true", "apiGroups: [topology.volcano.sh]\n  resources: [hypernodes]\n  verbs: [list, create, update, delete]"}},
		"off":      {sets: []string{"controller.volcanoHyperNodes=false"}, want: []string{"--volcano-hypernodes=false"}, notWant: []string{"topology.volcano.sh", "resources: [hypernodes]"}},
	} {
		t.Run(name, func(t *testing.T) {
			args := []string{"template", "rel", chartDir, "-n", "ns"}
			for _, s := range tc.sets {
				args = append(args, "--set", s)
			}
			out, err := helm(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			checkRendered(t, out, tc.want, tc.notWant)
		})
	}
}

// checkRendered checks that the rendered chart has every string of want
// and none of notWant.
func checkRendered(t *testing.T, out string, want, notWant []string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("rendered chart lacks %q", w)
		}
	}
	for _, w := range notWant {
		if strings.Contains(out, w) {
			t.Errorf("rendered chart has %q", w)
		}
	}
}
