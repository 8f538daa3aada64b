package nodeplugin

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/internal/golden"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// The --print-slices output of every simulated machine is checked in, so any
// change to discovery or the device model shows up as a reviewed diff.
func TestPrintSlicesGolden(t *testing.T) {
	for _, machine := range nvmlsim.Machines() {
		t.Run(machine, func(t *testing.T) {
			var out bytes.Buffer
			cfg := &Config{
				DriverName: vocabulary.DriverName, NodeName: "node-1", Simulate: machine,
				PrintSlices: true, PluginDataDir: t.TempDir(), Out: &out,
				// Any control program: the node then publishes MPS shares.
				MPSControl: "/bin/true",
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			if err := Run(context.Background(), cfg); err != nil {
				t.Fatalf("Run: %v", err)
			}
			golden.Check(t, filepath.Join("testdata", "slices", machine+".yaml"), out.Bytes())
		})
	}
}
