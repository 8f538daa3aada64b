package cdi

import (
	"cmp"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// DriverFiles are the NVIDIA driver's user-space files that every container
// with one of this driver's devices needs. All paths are below the driver
// root: "/usr/lib64/libcuda.so.550.54.15" means that file inside the root.
type DriverFiles struct {
	// Version is the driver version taken from the library file names
	// (libnvidia-ml.so.<version>), or empty if it could not be determined.
	Version string
	// DeviceNodes are the control device nodes every spec names:
	// /dev/nvidiactl, /dev/nvidia-uvm and /dev/nvidia-uvm-tools. Only
	// /dev/nvidiactl must exist at discovery; the UVM nodes appear when
	// nvidia-uvm loads, which on a fresh node may be after the plugin
	// starts. Every spec write looks all of them up, and fails naming the
	// one that is missing (see docs/cdi.md).
	DeviceNodes []string
	// Libraries are the compute and utility libraries found.
	Libraries []Library
	// Binaries are the utility and compute binaries found.
	Binaries []Binary
}

// Library is one driver library.
type Library struct {
	// Path is the library file, with symbolic links resolved.
	Path string
	// Names are the file names under which programs load the library: its
	// real name (libcuda.so.550.54.15), its SONAME (libcuda.so.1), the
	// names of symbolic links to it next to it, and its linker name
	// (libcuda.so). Sorted.
	Names []string
}

// Binary is one driver executable.
type Binary struct {
	// Name is the command name, for example "nvidia-smi".
	Name string
	// Path is the executable, with symbolic links resolved.
	Path string
}

// The file sets are those the NVIDIA container stack (libnvidia-container,
// src/nvc_info.c) injects for the "utility" and "compute" driver
// capabilities; graphics, video, NGX and firmware are out of scope.
var (
	// requiredLibraries must exist, or discovery fails.
	requiredLibraries = []string{
		"libnvidia-ml.so", // management library (NVML): first, it gives the version
		"libcuda.so",      // CUDA driver API
	}
	optionalLibraries = []string{
		"libnvidia-cfg.so",             // GPU configuration
		"libnvidia-nscq.so",            // NVSwitch and GPU topology
		"libcudadebugger.so",           // CUDA debugger
		"libnvidia-opencl.so",          // OpenCL ICD
		"libnvidia-gpucomp.so",         // shared compiler library
		"libnvidia-ptxjitcompiler.so",  // PTX JIT compiler used by libcuda
		"libnvidia-fatbinaryloader.so", // fatbin loader used by libcuda (older drivers)
		"libnvidia-allocator.so",       // allocator runtime
		"libnvidia-compiler.so",        // NVVM-PTX compiler for OpenCL (older drivers)
		"libnvidia-pkcs11.so",          // confidential computing crypto
		"libnvidia-pkcs11-openssl3.so", // confidential computing crypto, OpenSSL 3
		"libnvidia-nvvm.so",            // NVVM compiler
		"libnvidia-tileiras.so",        // Tile IR JIT
	}
	binaryNames = []string{
		"nvidia-smi",
		"nvidia-debugdump",
		"nvidia-persistenced",
		"nvidia-cuda-mps-control",
		"nvidia-cuda-mps-server",
	}
	// controlDeviceNodes are needed by every CUDA user: CUDA cannot
	// initialize without the UVM nodes, so a spec without them would give a
	// container that fails at its first CUDA call.
	controlDeviceNodes = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
	binaryDirs         = []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/sbin"}
)

// DiscoverDriverFiles finds the driver files below driverRoot: "/" on a node
// whose driver is installed on the host, the driver container's root when the
// driver runs in a container, or a simulated root. Libraries are searched
// like the dynamic linker does: the directories in <root>/etc/ld.so.conf
// first, then the standard library directories of this architecture.
func DiscoverDriverFiles(driverRoot string) (*DriverFiles, error) {
	if driverRoot == "" {
		driverRoot = "/"
	}
	if fi, err := os.Stat(driverRoot); err != nil {
		return nil, fmt.Errorf("driver root: %w", err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("driver root %s is not a directory", driverRoot)
	}
	r := root(driverRoot)
	files := &DriverFiles{}

	// nvidiactl shows that this is a driver's root; the UVM nodes are
	// looked up at each spec write.
	if _, err := os.Stat(r.join(controlDeviceNodes[0])); err != nil {
		return nil, fmt.Errorf("driver root %s: control device node %s: %w", driverRoot, controlDeviceNodes[0], err)
	}
	files.DeviceNodes = slices.Clone(controlDeviceNodes)

	dirs := slices.Concat(r.ldSoConfDirs(), defaultLibraryDirs(runtime.GOARCH))
	dirs = dedupe(dirs)
	for i, name := range slices.Concat(requiredLibraries, optionalLibraries) {
		lib, err := r.findLibrary(dirs, name, files.Version)
		if err != nil {
			return nil, fmt.Errorf("driver root %s: %w", driverRoot, err)
		}
		if lib == nil {
			if i < len(requiredLibraries) {
				return nil, fmt.Errorf("driver root %s: %s not found in %s", driverRoot, name, strings.Join(dirs, ":"))
			}
			continue
		}
		if files.Version == "" {
			files.Version = versionSuffix(path.Base(lib.Path), name)
		}
		files.Libraries = append(files.Libraries, *lib)
	}

	for _, name := range binaryNames {
		bin, err := r.findBinary(name)
		if err != nil {
			return nil, fmt.Errorf("driver root %s: %w", driverRoot, err)
		}
		if bin != nil {
			files.Binaries = append(files.Binaries, *bin)
		}
	}
	return files, nil
}

// defaultLibraryDirs are the directories where distributions install 64-bit
// libraries, Debian multiarch first.
func defaultLibraryDirs(goarch string) []string {
	var dirs []string
	if triplet := multiarchTriplet(goarch); triplet != "" {
		dirs = append(dirs, "/usr/lib/"+triplet, "/lib/"+triplet)
	}
	return append(dirs, "/usr/lib64", "/lib64", "/usr/lib", "/lib")
}

// multiarchTriplet returns the Debian multiarch directory name for goarch.
func multiarchTriplet(goarch string) string {
	switch goarch {
	case "amd64":
		return "x86_64-linux-gnu"
	case "arm64":
		return "aarch64-linux-gnu"
	case "ppc64le":
		return "powerpc64le-linux-gnu"
	default:
		return ""
	}
}

// root is a directory that stands for "/" of some file system tree.
type root string

// join returns the path on this machine of p, a path below the root.
func (r root) join(p string) string {
	return filepath.Join(string(r), p)
}

// resolve returns p, a path below the root, with all symbolic links resolved
// inside the root: absolute link targets and ".." never leave it.
func (r root) resolve(p string) (string, error) {
	const maxLinks = 40
	links := 0
	resolved := "/"
	remaining := p
	for remaining != "" {
		var comp string
		comp, remaining, _ = strings.Cut(strings.TrimLeft(remaining, "/"), "/")
		switch comp {
		case "", ".":
			continue
		case "..":
			resolved = path.Dir(resolved)
			continue
		}
		next := path.Join(resolved, comp)
		fi, err := os.Lstat(r.join(next))
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("resolve %s: too many levels of symbolic links", p)
		}
		target, err := os.Readlink(r.join(next))
		if err != nil {
			return "", err
		}
		if path.IsAbs(target) {
			resolved = "/"
		}
		remaining = target + "/" + remaining
	}
	return resolved, nil
}

// ldSoConfDirs returns the library directories named in <root>/etc/ld.so.conf
// and the files it includes. A missing file is not an error.
func (r root) ldSoConfDirs() []string {
	var dirs []string
	r.readLdSoConf("/etc/ld.so.conf", 0, &dirs)
	return dirs
}

func (r root) readLdSoConf(file string, depth int, dirs *[]string) {
	if depth > 8 {
		return
	}
	content, err := os.ReadFile(r.join(file))
	if err != nil {
		return
	}
	for line := range strings.Lines(string(content)) {
		line, _, _ = strings.Cut(line, "#")
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		if pattern, ok := strings.CutPrefix(line, "include"); ok && (pattern == "" || pattern[0] == ' ' || pattern[0] == '\t') {
			for _, p := range strings.Fields(pattern) {
				if !path.IsAbs(p) {
					p = path.Join(path.Dir(file), p)
				}
				matches, _ := filepath.Glob(r.join(p))
				slices.Sort(matches)
				for _, m := range matches {
					rel, err := filepath.Rel(string(r), m)
					if err != nil {
						continue
					}
					r.readLdSoConf("/"+filepath.ToSlash(rel), depth+1, dirs)
				}
			}
			continue
		}
		// "dir=type" (old libc5 syntax) names a directory too.
		dir, _, _ := strings.Cut(line, "=")
		if path.IsAbs(dir) {
			*dirs = append(*dirs, path.Clean(dir))
		}
	}
}

// findLibrary looks for the library with linker name name (libcuda.so) in
// dirs, in order, and returns the first match. When a directory holds several
// versions, it prefers the driver version wantVersion, then the file the
// SONAME link points to, then the highest version. It returns nil if the
// library is in none of the directories.
func (r root) findLibrary(dirs []string, name, wantVersion string) (*Library, error) {
	for _, dir := range dirs {
		entries, err := os.ReadDir(r.join(dir))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("look up %s: %w", name, err)
		}
		// Real file below the root -> names in dir that resolve to it.
		byTarget := map[string][]string{}
		linked := map[string]bool{}
		for _, entry := range entries {
			base := entry.Name()
			if base != name && !strings.HasPrefix(base, name+".") {
				continue
			}
			target, err := r.resolve(path.Join(dir, base))
			if err != nil {
				continue // dangling link
			}
			fi, err := os.Stat(r.join(target))
			if err != nil || !fi.Mode().IsRegular() || !r.matchesArch(target) {
				continue
			}
			byTarget[target] = append(byTarget[target], base)
			if path.Base(target) != base {
				linked[target] = true
			}
		}
		if len(byTarget) == 0 {
			continue
		}
		targets := slices.Collect(maps.Keys(byTarget))
		slices.SortFunc(targets, func(a, b string) int {
			return cmp.Or(
				-cmpBool(wantVersion != "" && versionSuffix(path.Base(a), name) == wantVersion,
					wantVersion != "" && versionSuffix(path.Base(b), name) == wantVersion),
				-cmpBool(linked[a], linked[b]),
				-compareVersions(versionSuffix(path.Base(a), name), versionSuffix(path.Base(b), name)),
				strings.Compare(a, b),
			)
		})
		chosen := targets[0]
		names := append([]string{name, path.Base(chosen)}, byTarget[chosen]...)
		if soname := r.soname(chosen); soname != "" {
			names = append(names, soname)
		}
		slices.Sort(names)
		return &Library{Path: chosen, Names: slices.Compact(names)}, nil
	}
	return nil, nil
}

// findBinary looks for an executable called name in the usual binary
// directories and returns nil if there is none.
func (r root) findBinary(name string) (*Binary, error) {
	for _, dir := range binaryDirs {
		target, err := r.resolve(path.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("look up %s: %w", name, err)
		}
		fi, err := os.Stat(r.join(target))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			continue
		}
		return &Binary{Name: name, Path: target}, nil
	}
	return nil, nil
}

// matchesArch reports whether the file at p (below the root) can be loaded
// by processes of this architecture. Files that are not ELF (as in simulated
// roots) match.
func (r root) matchesArch(p string) bool {
	f, err := elf.Open(r.join(p))
	if err != nil {
		return true
	}
	defer f.Close()
	want, ok := elfMachines[runtime.GOARCH]
	return f.Class == elf.ELFCLASS64 && (!ok || f.Machine == want)
}

var elfMachines = map[string]elf.Machine{
	"amd64":   elf.EM_X86_64,
	"arm64":   elf.EM_AARCH64,
	"ppc64le": elf.EM_PPC64,
}

// soname returns the DT_SONAME of the ELF library at p (below the root), or
// "" if it has none or is not ELF.
func (r root) soname(p string) string {
	f, err := elf.Open(r.join(p))
	if err != nil {
		return ""
	}
	defer f.Close()
	names, err := f.DynString(elf.DT_SONAME)
	if err != nil || len(names) == 0 || strings.Contains(names[0], "/") {
		return ""
	}
	return names[0]
}

// versionSuffix returns "550.54.15" for file "libcuda.so.550.54.15" and
// linker name "libcuda.so", and "" unless the suffix is a dotted version with
// at least two components (so SONAME suffixes like ".1" are not versions).
func versionSuffix(file, linkerName string) string {
	v, ok := strings.CutPrefix(file, linkerName+".")
	if !ok || !strings.Contains(v, ".") {
		return ""
	}
	for part := range strings.SplitSeq(v, ".") {
		if _, err := strconv.Atoi(part); err != nil {
			return ""
		}
	}
	return v
}

// compareVersions compares dotted numeric versions; "" sorts lowest.
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(pa), len(pb)) {
		var na, nb int
		if i < len(pa) {
			na, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			nb, _ = strconv.Atoi(pb[i])
		}
		if c := cmp.Compare(na, nb); c != 0 {
			return c
		}
	}
	return 0
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	default:
		return -1
	}
}

func dedupe(s []string) []string {
	seen := make(map[string]bool, len(s))
	return slices.DeleteFunc(s, func(v string) bool {
		if seen[v] {
			return true
		}
		seen[v] = true
		return false
	})
}
