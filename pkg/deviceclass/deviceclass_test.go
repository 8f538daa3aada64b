package deviceclass

import (
	"bytes"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/internal/golden"
)

// The shipped YAML is generated from Classes; this keeps them in sync.
func TestShippedDeviceClasses(t *testing.T) {
	var buf bytes.Buffer
	buf.WriteString("# Generated from pkg/deviceclass (go test ./pkg/deviceclass -update). Do not edit.\n")
	for _, c := range DeviceClasses("gpu.dra.dev") {
		data, err := yaml.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		buf.WriteString("---\n")
		buf.Write(data)
	}
	golden.Check(t, "../../deployments/static/deviceclasses.yaml", buf.Bytes())
}

func TestSelectorNamesDriver(t *testing.T) {
	got := Classes[0].Selector("example.com")
	want := `device.driver == "example.com" && device.attributes["example.com"].type == "gpu"`
	if got != want {
		t.Errorf("Selector = %s, want %s", got, want)
	}
}

// Under NVIDIA's driver name the classes NVIDIA's driver has keep NVIDIA's
// names (gpu.nvidia.com, mig.nvidia.com), so its users' claims find them;
// the share classes NVIDIA's driver lacks keep this driver's naming, and the
// passthrough class is vfio.gpu.nvidia.com, the name NVIDIA's driver gives its own.
// NVIDIA's channel class belongs to its other driver (compute-domain.nvidia.com)
// and no user names it, so the IMEX channel class keeps this driver's naming.
func TestNVIDIAClassNames(t *testing.T) {
	var got []string
	for _, c := range DeviceClasses("gpu.nvidia.com") {
		got = append(got, c.Name)
	}
	want := []string{"gpu.nvidia.com", "mig.nvidia.com", "timeslice.gpu.nvidia.com", "mps.gpu.nvidia.com", "vfio.gpu.nvidia.com", "imex-channel.gpu.nvidia.com"}
	if !slices.Equal(got, want) {
		t.Errorf("class names = %v, want %v", got, want)
	}
	if sel := Classes[1].Selector("gpu.nvidia.com"); sel != `device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "mig"` {
		t.Errorf("MIG selector = %s", sel)
	}
}
