// Package layout checks the architecture the docs describe against the
// code: which packages may import what, and that docs/architecture.md names
// every package and nothing that is gone. It shells out to `go list`, so
// it sees exactly what the build sees.
package layout

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gpu-dra/gpu-dra-driver"

// pkg is what `go list -json` says of one package, as far as the rules need.
type pkg struct {
	ImportPath string
	Imports    []string // non-test imports
	Deps       []string // transitive non-test imports
	Standard   bool
	CgoFiles   []string
}

func root(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// list runs `go list -json` (with -deps: the packages and all they import)
// over patterns from the module root.
func list(t *testing.T, deps bool, patterns ...string) []pkg {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to list packages with: %v", err)
	}
	args := []string{"list", "-json"}
	if deps {
		args = append(args, "-deps")
	}
	cmd := exec.Command(goTool, append(args, patterns...)...)
	cmd.Dir = root(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", patterns, err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func rel(p string) string { return strings.TrimPrefix(strings.TrimPrefix(p, module), "/") }

func under(p string, prefixes ...string) bool {
	return slices.ContainsFunc(prefixes, func(pre string) bool {
		return p == pre || strings.HasPrefix(p, strings.TrimSuffix(pre, "/")+"/")
	})
}

// TestShippedBinariesLinkOnlyWhatTheyNeed: the controller and kubectl gpu
// run where no GPU (and no NVML) is, so they build with CGO_ENABLED=0 and
// take published names from pkg/vocabulary, not the device model; no
// shipped binary links test support.
func TestShippedBinariesLinkOnlyWhatTheyNeed(t *testing.T) {
	for _, r := range []struct {
		cmd    string
		noNVML bool
	}{
		{"cmd/dra-controller", true},
		{"cmd/kubectl-gpu", true},
		{"cmd/dra-kubelet-plugin", false},
	} {
		t.Run(r.cmd, func(t *testing.T) {
			for _, d := range list(t, true, "./"+r.cmd) {
				switch {
				case under(rel(d.ImportPath), "internal") && strings.HasPrefix(d.ImportPath, module):
					t.Errorf("%s links test support %s", r.cmd, d.ImportPath)
				case !r.noNVML:
				case strings.HasPrefix(d.ImportPath, "github.com/NVIDIA/go-nvml"), under(rel(d.ImportPath), "pkg/nvmlsim", "pkg/discovery", "pkg/devicemodel"):
					t.Errorf("%s links %s: it must not need NVML (published names are in pkg/vocabulary)", r.cmd, d.ImportPath)
				case len(d.CgoFiles) > 0 && !d.Standard:
					// The standard library's cgo packages have pure Go
					// fallbacks; anything else stops CGO_ENABLED=0 builds.
					t.Errorf("%s links %s, which needs cgo: the binary must build with CGO_ENABLED=0", r.cmd, d.ImportPath)
				}
			}
		})
	}
}

// TestLeavesDependOnlyOnWhatTheyMeasure: the vocabulary is a leaf every
// binary can use; health and telemetry take plain inputs (Device, Holder,
// Allocations), and the packages that own the checkpoint format, the device
// model and the prepare engine adapt their data to them
// (pkg/prepare/observe.go), never the other way round.
func TestLeavesDependOnlyOnWhatTheyMeasure(t *testing.T) {
	owners := []string{"pkg/checkpoint", "pkg/devicemodel", "pkg/prepare", "pkg/podattribution", "pkg/nodeplugin"}
	for _, r := range []struct {
		pkg    string
		forbid []string // module-relative packages, with what is below them
		stdlib bool     // only the standard library
	}{
		{pkg: "pkg/vocabulary", stdlib: true},
		{pkg: "pkg/health", forbid: owners},
		{pkg: "pkg/telemetry", forbid: owners},
	} {
		t.Run(r.pkg, func(t *testing.T) {
			deps := list(t, true, "./"+r.pkg)
			if len(deps) < 2 {
				t.Fatalf("go list -deps %s listed %d packages, want it and its dependencies", r.pkg, len(deps))
			}
			for _, d := range deps {
				switch {
				case d.ImportPath == module+"/"+r.pkg:
				case r.stdlib && !d.Standard:
					t.Errorf("%s depends on %s; it may import only the standard library", r.pkg, d.ImportPath)
				case strings.HasPrefix(d.ImportPath, module) && under(rel(d.ImportPath), r.forbid...):
					t.Errorf("%s depends on %s", r.pkg, d.ImportPath)
				}
			}
		})
	}
}

// TestSimulationWiredByCompositionRootsOnly: production packages reach the
// simulation only where simulation is chosen (the plugin's composition
// root and the hardware check's comparison); everything else sees
// nvml.Interface.
func TestSimulationWiredByCompositionRootsOnly(t *testing.T) {
	allowed := []string{"pkg/nvmlsim", "pkg/nodeplugin", "pkg/hwcheck", "cmd", "internal"}
	for _, p := range list(t, false, "./...") {
		r := rel(p.ImportPath)
		if under(r, allowed...) {
			continue
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module) && under(rel(imp), "pkg/nvmlsim") {
				t.Errorf("%s imports %s: only composition roots wire the simulation", r, imp)
			}
		}
	}
}

var pathRE = regexp.MustCompile("(?:^|[\\s`(])((?:pkg|internal|cmd|api|test)/[a-z0-9_/.-]*[a-z0-9])")

// TestArchitectureDocMatchesCode: docs/architecture.md names every package
// under pkg/, internal/, cmd/ and api/, and no path that does not exist.
func TestArchitectureDocMatchesCode(t *testing.T) {
	dir := root(t)
	doc, err := os.ReadFile(filepath.Join(dir, "docs/architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, m := range pathRE.FindAllStringSubmatch(string(doc), -1) {
		p := strings.TrimSuffix(m[1], "/")
		named[p] = true
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("docs/architecture.md names %s, which does not exist", p)
		}
	}
	for _, p := range list(t, false, "./...") {
		r := rel(p.ImportPath)
		if !under(r, "pkg", "internal", "cmd", "api") || named[r] {
			continue
		}
		t.Errorf("docs/architecture.md does not name package %s", r)
	}
}
