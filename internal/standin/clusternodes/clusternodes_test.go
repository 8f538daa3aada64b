package clusternodes

import (
	"bytes"
	"os"
	"testing"
)

// The checked-in --print-slices output parses into every slice it holds.
func TestParseSlices(t *testing.T) {
	data, err := os.ReadFile("../../../pkg/nodeplugin/testdata/slices/dgxa100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	slices, err := parseSlices(bytes.ReplaceAll(data, []byte("node-1"), []byte("fake-a100")))
	if err != nil {
		t.Fatal(err)
	}
	if want := bytes.Count(data, []byte("\nkind: ResourceSlice\n")); len(slices) != want || want == 0 {
		t.Fatalf("%d slices, want %d", len(slices), want)
	}
	for _, s := range slices {
		if s.Spec.NodeName == nil || *s.Spec.NodeName != "fake-a100" || s.Spec.Pool.Name != "fake-a100" || len(s.Spec.Devices) == 0 && len(s.Spec.SharedCounters) == 0 {
			t.Errorf("slice %s: node %v, pool %s, %d devices", s.GenerateName, s.Spec.NodeName, s.Spec.Pool.Name, len(s.Spec.Devices))
		}
	}
	if _, err := parseSlices([]byte("kind: ResourceSlice\nspec: [")); err == nil {
		t.Error("no error for broken YAML")
	}
}
