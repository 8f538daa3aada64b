package deviceclass

import (
	"bytes"
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
