package telemetry

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLeavesDependOnlyOnWhatTheyMeasure: health and telemetry take plain
// inputs (Device, Holder, Allocations); the packages that own the
// checkpoint format, the device model and the prepare engine adapt their
// data to them (pkg/prepare/observe.go), never the other way round.
func TestLeavesDependOnlyOnWhatTheyMeasure(t *testing.T) {
	const module = "github.com/gpu-dra/gpu-dra-driver/"
	forbidden := []string{"pkg/checkpoint", "pkg/devicemodel", "pkg/prepare", "pkg/podattribution", "pkg/nodeplugin"}
	for _, leaf := range []string{"pkg/health", "pkg/telemetry"} {
		t.Run(leaf, func(t *testing.T) {
			goTool, err := exec.LookPath("go")
			if err != nil {
				t.Skipf("no go tool to list %s's dependencies: %v", leaf, err)
			}
			out, err := exec.Command(goTool, "list", "-deps", "-f", "{{.ImportPath}}", module+leaf).CombinedOutput()
			if err != nil {
				t.Fatalf("go list -deps %s: %v\n%s", leaf, err, out)
			}
			deps := strings.Fields(string(out))
			if len(deps) < 2 {
				t.Fatalf("go list -deps %s listed %q, want the package and its dependencies", leaf, deps)
			}
			for _, dep := range deps {
				for _, f := range forbidden {
					if dep == module+f || strings.HasPrefix(dep, module+f+"/") {
						t.Errorf("%s depends on %s", leaf, dep)
					}
				}
			}
		})
	}
}
