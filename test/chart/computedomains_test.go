package chart

import (
	"strings"
	"testing"
)

// The compute domain pieces of the chart follow controller.computeDomains:
// the CRD comes from crds/; the flags, the controller's permissions on
// ComputeDomains, channel claims, pods and slices, and the admission policy
// on its slice writes exist only when enabled; the policy on status writes
// whenever the controller or the plugins handle domains; the schema bounds the
// channel count as the controller's flag does.
func TestComputeDomainsRenders(t *testing.T) {
	helmBinary(t)
	render := func(t *testing.T, args ...string) (string, error) {
		t.Helper()
		return helm(t, append([]string{"template", "rel", chartDir, "-n", "ns"}, args...)...)
	}
	for name, tc := range map[string]struct {
		args          []string
		want, notWant []string
	}{
		"defaults": {
			want: []string{"--compute-domains=true", "--imex-channels-per-clique=32", "--compute-domain-prune-grace-period=5m",
				"resources: [computedomains]\n  verbs: [get, list, watch, delete]", "resources: [computedomains/status]\n  verbs: [patch, update]",
				"resources: [resourceclaims]\n  verbs: [get, list, watch, create]",
				"resources: [resourceclaimtemplates] # the domains' channel templates\n  verbs: [get, create]",
				"resources: [resourceslices]\n  verbs: [create, update, delete]",
				"name: rel-gpu-dra-driver-controller-resourceslices", "name: rel-gpu-dra-driver-computedomain-status"},
			notWant: []string{"kind: CustomResourceDefinition"}, // not without --include-crds
		},
		"CRD from crds/": {
			args: []string{"--include-crds"},
			want: []string{"kind: CustomResourceDefinition", "name: computedomains.gpu.dra.dev"},
		},
		"tuned": {
			args: []string{"--set", "controller.computeDomains.imexChannelsPerClique=128,controller.computeDomains.pruneGracePeriod=1m"},
			want: []string{"--imex-channels-per-clique=128", "--compute-domain-prune-grace-period=1m"},
		},
		// The nodes' plugins still read the entries: the status policy stays.
		"plugin side only": {
			args:    []string{"--set", "controller.computeDomains.enabled=false"},
			want:    []string{"name: rel-gpu-dra-driver-computedomain-status"},
			notWant: []string{"controller-resourceslices"},
		},
		"off": {
			args:    []string{"--set", "controller.computeDomains.enabled=false,kubeletPlugin.imex.enabled=false"},
			want:    []string{"--compute-domains=false"},
			notWant: []string{"computedomains", "resources: [resourceclaims]\n  verbs: [get, list, watch, create]", "the domains' channel templates", "controller-resourceslices"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := render(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
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
	for _, n := range []string{"0", "129"} {
		out, err := render(t, "--set", "controller.computeDomains.imexChannelsPerClique="+n)
		if err == nil || !strings.Contains(out, "imexChannelsPerClique") {
			t.Errorf("imexChannelsPerClique=%s renders (%v), want the schema to refuse it by name:\n%.300s", n, err, out)
		}
	}
}
