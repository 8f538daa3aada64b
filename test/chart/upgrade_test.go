package chart

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// kubeletCallTimeout is the kubelet's timeout of a DRA call, which bounds
// each call an old plugin pod finishes before it hands the node over.
const kubeletCallTimeout = 45

// The plugin's DaemonSet rolls without downtime: the new pod starts beside
// the old one (maxSurge 1, maxUnavailable 0), gets its pod UID for
// per-pod sockets, and the old one has time to finish the kubelet's calls.
func TestPluginRollsWithoutDowntime(t *testing.T) {
	out, err := helm(t, "template", "rel", chartDir, "-n", "ns")
	if err != nil {
		t.Fatal(err)
	}
	ds := pluginDaemonSet(t, out)
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil ||
		ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 1 || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("updateStrategy = %+v, want RollingUpdate with maxSurge 1, maxUnavailable 0", ds.Spec.UpdateStrategy)
	}
	if g := ds.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g <= kubeletCallTimeout {
		t.Errorf("terminationGracePeriodSeconds = %v, want more than the kubelet's %ds call timeout", g, kubeletCallTimeout)
	}
	found := false
	for _, e := range ds.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "POD_UID" { // --pod-uid's environment twin
			found = e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.uid"
		}
	}
	if !found {
		t.Errorf("plugin container has no POD_UID from metadata.uid: %+v", ds.Spec.Template.Spec.Containers[0].Env)
	}
	if _, err := helm(t, "template", "rel", chartDir, "-n", "ns", "--set", "kubeletPlugin.terminationGracePeriodSeconds=0"); err == nil ||
		!strings.Contains(err.Error(), "terminationGracePeriodSeconds") {
		t.Errorf("terminationGracePeriodSeconds=0 rendered (err %v), want the schema to refuse it", err)
	}
}

// pluginDaemonSet finds the kubelet plugin's DaemonSet in rendered YAML.
func pluginDaemonSet(t *testing.T, rendered string) *appsv1.DaemonSet {
	t.Helper()
	for _, doc := range strings.Split(rendered, "\n---") {
		if !strings.Contains(doc, "kind: DaemonSet") {
			continue
		}
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
			t.Fatalf("DaemonSet: %v", err)
		}
		if strings.HasSuffix(ds.Name, "-kubelet-plugin") {
			return &ds
		}
	}
	t.Fatalf("no kubelet plugin DaemonSet in:\n%s", rendered)
	return nil
}
