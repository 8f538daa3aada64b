package cdi

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

const testDriverVersion = "550.54.15"

// fakeRoot builds a driver root like a node's: device nodes, a driver's
// libraries with their SONAME and linker-name links, a stale library of an
// older driver, and binaries.
type fakeRoot struct {
	t   *testing.T
	dir string
	// libDir is the first standard library directory for this architecture.
	libDir string
}

func newFakeRoot(t *testing.T) *fakeRoot {
	t.Helper()
	r := &fakeRoot{t: t, dir: t.TempDir(), libDir: defaultLibraryDirs(runtime.GOARCH)[0]}
	for _, n := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidia-caps/nvidia-cap21"} {
		r.device("/dev/" + n)
	}
	v := testDriverVersion
	for _, lib := range []struct{ linkerName, soname string }{
		{"libnvidia-ml.so", "libnvidia-ml.so.1"},
		{"libcuda.so", "libcuda.so.1"},
		{"libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"},
		{"libnvidia-nvvm.so", "libnvidia-nvvm.so.4"},
	} {
		real := lib.linkerName + "." + v
		r.file(filepath.Join(r.libDir, real), 0o644, "fake "+real)
		r.symlink(filepath.Join(r.libDir, lib.soname), real)
	}
	r.symlink(filepath.Join(r.libDir, "libcuda.so"), "libcuda.so.1")
	// Left behind by the previous driver; must not be picked.
	r.file(filepath.Join(r.libDir, "libcuda.so.535.104.05"), 0o644, "old")
	// Not a driver library despite the common prefix.
	r.file(filepath.Join(r.libDir, "libcuda.so-gdb.py"), 0o644, "")

	r.file("/usr/bin/nvidia-smi", 0o755, "#!/bin/sh\n")
	// An absolute link must resolve inside the root, not on this machine.
	r.file("/opt/nvidia/bin/nvidia-cuda-mps-control", 0o755, "#!/bin/sh\n")
	r.symlink("/usr/bin/nvidia-cuda-mps-control", "/opt/nvidia/bin/nvidia-cuda-mps-control")
	// Not executable: skipped.
	r.file("/usr/bin/nvidia-debugdump", 0o644, "")
	return r
}

// path returns the path on this machine of p, a path below the root.
func (r *fakeRoot) path(p string) string {
	return filepath.Join(r.dir, p)
}

// device creates a character device 1:3 (like /dev/null) at p. Without the
// privilege to mknod it links to /dev/null instead, which also stats as
// character device 1:3; a regular file would not, and runtimes reject it.
func (r *fakeRoot) device(p string) {
	r.t.Helper()
	full := r.path(p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := unix.Mknod(full, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err == nil {
		return
	}
	if err := os.Symlink("/dev/null", full); err != nil {
		r.t.Fatal(err)
	}
}

func (r *fakeRoot) mkdir(p string) {
	r.t.Helper()
	if err := os.MkdirAll(r.path(p), 0o755); err != nil {
		r.t.Fatal(err)
	}
}

func (r *fakeRoot) file(p string, mode os.FileMode, content string) {
	r.t.Helper()
	full := r.path(p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), mode); err != nil {
		r.t.Fatal(err)
	}
	if err := os.Chmod(full, mode); err != nil {
		r.t.Fatal(err)
	}
}

func (r *fakeRoot) fileBytes(p string, content []byte) {
	r.t.Helper()
	r.file(p, 0o644, "")
	if err := os.WriteFile(r.path(p), content, 0o644); err != nil {
		r.t.Fatal(err)
	}
}

func (r *fakeRoot) symlink(p, target string) {
	r.t.Helper()
	full := r.path(p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		r.t.Fatal(err)
	}
	if err := os.Symlink(target, full); err != nil {
		r.t.Fatal(err)
	}
}

// elfHeader returns a minimal ELF file header (no sections) of the given
// class and machine: enough for debug/elf to report both.
func elfHeader(class elfClass, machine uint16) []byte {
	ident := []byte{0x7f, 'E', 'L', 'F', byte(class), 1 /* little endian */, 1 /* version */}
	ident = append(ident, make([]byte, 16-len(ident))...)
	var b []byte
	b = append(b, ident...)
	b = binary.LittleEndian.AppendUint16(b, 3) // ET_DYN
	b = binary.LittleEndian.AppendUint16(b, machine)
	b = binary.LittleEndian.AppendUint32(b, 1) // version
	if class == elfClass32 {
		b = append(b, make([]byte, 4*3)...) // entry, phoff, shoff
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = binary.LittleEndian.AppendUint16(b, 52) // ehsize
	} else {
		b = append(b, make([]byte, 8*3)...)
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = binary.LittleEndian.AppendUint16(b, 64)
	}
	// phentsize, phnum, shentsize, shnum, shstrndx
	b = append(b, make([]byte, 2*5)...)
	return b
}

type elfClass byte

const (
	elfClass32 elfClass = 1
	elfClass64 elfClass = 2
)
