package scenarios

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/pkg/kubectlgpu"
)

func TestLoadsOfTheTopScenario(t *testing.T) {
	s, err := LoadFile(filepath.Join("..", "..", "demo", "specs", "10-gpu-top.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := []GPULoad{
		{Namespace: "demo-top", Pod: "trainer", Container: "train", SMPercent: 60, MemoryBytes: 12 << 30},
		{Namespace: "demo-top", Pod: "notebook", Container: "jupyter", SMPercent: 15, MemoryBytes: 3 << 30},
	}
	if got := Loads(s); !reflect.DeepEqual(got, want) {
		t.Errorf("Loads = %+v, want %+v", got, want)
	}
}

func TestTopProblems(t *testing.T) {
	sm := func(v float64) *float64 { return &v }
	list := &kubectlgpu.TopList{Items: []kubectlgpu.TopRow{
		{Namespace: "ns", Pod: "a", Container: "c", SMPercent: sm(59)},
		{Namespace: "ns", Pod: "b", Container: "c", SMPercent: sm(40)},
		{Namespace: "ns", Pod: "d", Container: "c"},
	}}
	loads := []GPULoad{
		{Namespace: "ns", Pod: "a", Container: "c", SMPercent: 60},
		{Namespace: "ns", Pod: "b", Container: "c", SMPercent: 15},
		{Namespace: "ns", Pod: "d", Container: "c", SMPercent: 15},
		{Namespace: "ns", Pod: "e", Container: "c", SMPercent: 15},
	}
	got := strings.Join(TopProblems(list, loads, 2), "\n")
	for _, want := range []string{"ns/b uses 40.0% SM, it declares 15%", "no SM figure for ns/d", "no row for ns/e"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "ns/a") {
		t.Errorf("a load within tolerance is a problem:\n%s", got)
	}
}
