package cdi

import (
	"debug/elf"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDiscoverDriverFiles(t *testing.T) {
	r := newFakeRoot(t)
	lib := func(linkerName string, names ...string) Library {
		return Library{
			Path:  filepath.Join(r.libDir, linkerName+"."+testDriverVersion),
			Names: append([]string{linkerName}, names...),
		}
	}
	want := &DriverFiles{
		Version:     testDriverVersion,
		DeviceNodes: []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"},
		Libraries: []Library{
			lib("libnvidia-ml.so", "libnvidia-ml.so.1", "libnvidia-ml.so."+testDriverVersion),
			lib("libcuda.so", "libcuda.so.1", "libcuda.so."+testDriverVersion),
			lib("libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so."+testDriverVersion),
			lib("libnvidia-nvvm.so", "libnvidia-nvvm.so.4", "libnvidia-nvvm.so."+testDriverVersion),
		},
		Binaries: []Binary{
			{Name: "nvidia-smi", Path: "/usr/bin/nvidia-smi"},
			{Name: "nvidia-cuda-mps-control", Path: "/opt/nvidia/bin/nvidia-cuda-mps-control"},
		},
	}
	got, err := DiscoverDriverFiles(r.dir)
	if err != nil {
		t.Fatalf("DiscoverDriverFiles: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("discovered files (-want +got):\n%s", diff)
	}
}

func TestDiscoverDriverFilesSearchOrder(t *testing.T) {
	r := newFakeRoot(t)
	// ld.so.conf names a directory that is searched before the standard ones.
	r.file("/etc/ld.so.conf", 0o644, "# comment\ninclude /etc/ld.so.conf.d/*.conf\n")
	r.file("/etc/ld.so.conf.d/nvidia.conf", 0o644, "/opt/nvidia/lib64 # driver\n")
	r.file("/opt/nvidia/lib64/libnvidia-cfg.so."+testDriverVersion, 0o644, "")
	r.file(filepath.Join(r.libDir, "libnvidia-cfg.so.1.0.0"), 0o644, "") // in a later directory
	// A 32-bit build first in the search order is skipped for the 64-bit one.
	machine, ok := elfMachines[runtime.GOARCH]
	if !ok {
		t.Skipf("no ELF machine known for %s", runtime.GOARCH)
	}
	r.fileBytes("/opt/nvidia/lib64/libnvidia-allocator.so."+testDriverVersion, elfHeader(elfClass32, uint16(elf.EM_386)))
	r.fileBytes("/usr/lib64/libnvidia-allocator.so."+testDriverVersion, elfHeader(elfClass64, uint16(machine)))

	got, err := DiscoverDriverFiles(r.dir)
	if err != nil {
		t.Fatalf("DiscoverDriverFiles: %v", err)
	}
	paths := map[string]string{}
	for _, l := range got.Libraries {
		paths[l.Names[0]] = l.Path
	}
	for name, want := range map[string]string{
		"libnvidia-cfg.so":       "/opt/nvidia/lib64/libnvidia-cfg.so." + testDriverVersion,
		"libnvidia-allocator.so": "/usr/lib64/libnvidia-allocator.so." + testDriverVersion,
	} {
		if paths[name] != want {
			t.Errorf("%s found at %q, want %q", name, paths[name], want)
		}
	}
}

// TestDiscoverSoname checks SONAME extraction on a real shared library of the
// machine running the test.
func TestDiscoverSoname(t *testing.T) {
	var system string
	for _, dir := range defaultLibraryDirs(runtime.GOARCH) {
		if p := filepath.Join(dir, "libc.so.6"); fileExists(p) {
			system = p
			break
		}
	}
	if system == "" {
		t.Skip("no libc.so.6 on this machine")
	}
	content, err := os.ReadFile(system)
	if err != nil {
		t.Fatal(err)
	}
	r := newFakeRoot(t)
	r.fileBytes(filepath.Join(r.libDir, "libnvidia-cfg.so."+testDriverVersion), content)
	got, err := DiscoverDriverFiles(r.dir)
	if err != nil {
		t.Fatalf("DiscoverDriverFiles: %v", err)
	}
	for _, l := range got.Libraries {
		if strings.HasPrefix(filepath.Base(l.Path), "libnvidia-cfg.so.") {
			want := []string{"libc.so.6", "libnvidia-cfg.so", "libnvidia-cfg.so." + testDriverVersion}
			if diff := cmp.Diff(want, l.Names); diff != "" {
				t.Errorf("names (-want +got):\n%s", diff)
			}
			return
		}
	}
	t.Error("libnvidia-cfg.so not found")
}

func TestDiscoverDriverFilesErrors(t *testing.T) {
	tests := map[string]struct {
		remove  string // path below the root
		wantErr string
	}{
		"no libcuda": {
			remove:  "libcuda.so",
			wantErr: "libcuda.so not found",
		},
		"no NVML": {
			remove:  "libnvidia-ml.so",
			wantErr: "libnvidia-ml.so not found",
		},
		"no nvidiactl": {
			remove:  "/dev/nvidiactl",
			wantErr: "/dev/nvidiactl",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := newFakeRoot(t)
			if strings.HasPrefix(tc.remove, "/") {
				if err := os.Remove(r.path(tc.remove)); err != nil {
					t.Fatal(err)
				}
			} else {
				matches, _ := filepath.Glob(r.path(filepath.Join(r.libDir, tc.remove+"*")))
				for _, m := range matches {
					if err := os.Remove(m); err != nil {
						t.Fatal(err)
					}
				}
			}
			_, err := DiscoverDriverFiles(r.dir)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), r.dir) {
				t.Errorf("error = %v, want one naming the root and %q", err, tc.wantErr)
			}
		})
	}

	if _, err := DiscoverDriverFiles(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("DiscoverDriverFiles of a missing root succeeded")
	}
}

func TestRootResolve(t *testing.T) {
	r := newFakeRoot(t)
	r.symlink("/a/up", "../usr/bin/nvidia-smi")
	r.symlink("/a/escape", "../../../../../usr/bin/nvidia-smi")
	r.symlink("/a/loop1", "loop2")
	r.symlink("/a/loop2", "loop1")
	fr := root(r.dir)
	for p, want := range map[string]string{
		"/usr/bin/nvidia-cuda-mps-control":    "/opt/nvidia/bin/nvidia-cuda-mps-control",
		"/a/up":                               "/usr/bin/nvidia-smi",
		"/a/escape":                           "/usr/bin/nvidia-smi", // ".." stops at the root
		filepath.Join(r.libDir, "libcuda.so"): filepath.Join(r.libDir, "libcuda.so."+testDriverVersion),
	} {
		got, err := fr.resolve(p)
		if err != nil || got != want {
			t.Errorf("resolve(%s) = %q, %v; want %q", p, got, err, want)
		}
	}
	if _, err := fr.resolve("/a/loop1"); err == nil {
		t.Error("resolve of a link loop succeeded")
	}
}

func TestVersionHelpers(t *testing.T) {
	for file, want := range map[string]string{
		"libcuda.so.550.54.15": "550.54.15",
		"libcuda.so.1":         "",
		"libcuda.so":           "",
		"libcuda.so.550.x":     "",
	} {
		if got := versionSuffix(file, "libcuda.so"); got != want {
			t.Errorf("versionSuffix(%s) = %q, want %q", file, got, want)
		}
	}
	if compareVersions("550.54.15", "535.104.05") <= 0 || compareVersions("", "1.0") >= 0 || compareVersions("1.0", "1") != 0 {
		t.Error("compareVersions orders versions wrongly")
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
