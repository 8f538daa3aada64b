// Package deps checks what the binaries and the vocabulary link: the
// controller and kubectl gpu run where no GPU (and no NVML) is, so they
// must build without cgo; pkg/vocabulary is a leaf every binary can use.
package deps

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

const module = "github.com/gpu-dra/gpu-dra-driver/"

// dep is one package in the dependencies of another, as go list sees it.
type dep struct {
	path     string
	standard bool
	cgo      bool
}

// deps lists pkg and everything it imports, tests excluded.
func deps(t *testing.T, pkg string) []dep {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		var lookErr error
		if goBin, lookErr = exec.LookPath("go"); lookErr != nil {
			t.Skipf("no go command to list dependencies with (%v; %v)", err, lookErr)
		}
	}
	cmd := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}} {{len .CgoFiles}}", module+pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr)
	}
	var list []dep
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("go list -deps %s: unexpected line %q", pkg, line)
		}
		list = append(list, dep{path: f[0], standard: f[1] == "true", cgo: f[2] != "0"})
	}
	return list
}

// The controller and kubectl gpu read published names from pkg/vocabulary,
// not from the device model, which links go-nvml through discovery.
func TestBinariesWithoutNVML(t *testing.T) {
	for _, cmd := range []string{"cmd/dra-controller", "cmd/kubectl-gpu"} {
		t.Run(cmd, func(t *testing.T) {
			for _, d := range deps(t, cmd) {
				switch {
				case strings.HasPrefix(d.path, "github.com/NVIDIA/go-nvml"):
					t.Errorf("%s links %s: it must not need NVML (import pkg/vocabulary for published names)", cmd, d.path)
				case d.cgo && !d.standard:
					// The standard library's cgo packages have pure Go
					// fallbacks; anything else stops CGO_ENABLED=0 builds.
					t.Errorf("%s links %s, which needs cgo: the binary must build with CGO_ENABLED=0", cmd, d.path)
				}
			}
		})
	}
}

func TestVocabularyIsALeaf(t *testing.T) {
	for _, d := range deps(t, "pkg/vocabulary") {
		if !d.standard && d.path != module+"pkg/vocabulary" {
			t.Errorf("pkg/vocabulary imports %s: it may import only the standard library", d.path)
		}
	}
}
