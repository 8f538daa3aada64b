package hwcheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

func TestMachineFor(t *testing.T) {
	for product, want := range map[string]string{
		"NVIDIA H200":           "dgxh200",
		"NVIDIA H200 NVL":       "dgxh200", // closest: the report shows the name difference
		"NVIDIA H100 80GB HBM3": "dgxh100",
		"NVIDIA T4":             "",
	} {
		got, err := machineFor(product)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("machineFor(%q) = %q, %v; want %q", product, got, err, want)
		}
		if err != nil && !strings.Contains(err.Error(), "--compare-with") {
			t.Errorf("error %v does not say what to do", err)
		}
	}
}

// A print-slices output without some dynamic MIG placement is caught.
func TestMissingMIG(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	var yaml strings.Builder
	if err := devicemodel.WriteYAML(&yaml, node.Slices("gpu.dra.dev")); err != nil {
		t.Fatal(err)
	}
	printed, err := printedDevices([]byte(yaml.String()))
	if err != nil {
		t.Fatal(err)
	}
	if missing := missingMIG(node.GPUs, printed); len(missing) > 0 {
		t.Fatalf("the simulated node's own slices lack %v", missing)
	}
	g := &node.GPUs[2]
	p := g.MIG.Profiles[len(g.MIG.Profiles)-1]
	gone := devicemodel.MIGDeviceName(g, p.Name, p.Placements[0].Start)
	delete(printed, gone)
	if missing := missingMIG(node.GPUs, printed); !slices.Equal(missing, []string{gone}) {
		t.Errorf("missing %v, want [%s]", missing, gone)
	}
	if _, err := printedDevices([]byte("---\nkind: ResourceSlice\nbogus: 1\n")); err == nil {
		t.Error("an unknown field in the printed slices was accepted")
	}
}

func TestSpecPaths(t *testing.T) {
	file := filepath.Join(t.TempDir(), "spec.json")
	spec := `{"cdiVersion":"0.6.0","kind":"k8s.gpu.dra.dev/gpu",
		"containerEdits":{"deviceNodes":[{"path":"/dev/nvidiactl"}],"hooks":[{"hookName":"createContainer","path":"/usr/bin/nvidia-cdi-hook"}]},
		"devices":[{"name":"a","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0","hostPath":"/drv/dev/nvidia0"}],
			"mounts":[{"hostPath":"/drv/usr/lib/libcuda.so.1","containerPath":"/usr/lib/libcuda.so.1"},{"hostPath":"/dev/nvidiactl","containerPath":"/x"}]}}]}`
	if err := os.WriteFile(file, []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := specPaths(file)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/dev/nvidiactl", "/drv/dev/nvidia0", "/drv/usr/lib/libcuda.so.1", "/usr/bin/nvidia-cdi-hook"}
	if !slices.Equal(got, want) {
		t.Errorf("paths %v, want %v (host paths, sorted, once each)", got, want)
	}
}
