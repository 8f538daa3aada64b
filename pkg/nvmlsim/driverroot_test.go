package nvmlsim

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestMigMinorFormula(t *testing.T) {
	// The ends of /proc/driver/nvidia-caps/mig-minors shown in the MIG User Guide, and lines
	// quoted from real hosts in NVIDIA's container toolkit sources.
	tests := []struct {
		gpu, gi, ci int
		want        int
	}{
		{0, 0, -1, 3}, {0, 0, 0, 4}, {0, 0, 2, 6}, {3, 3, 3, 439}, {6, 11, 7, 920}, {31, 14, 7, 4322},
	}
	for _, tc := range tests {
		got := giAccessMinor(tc.gpu, tc.gi)
		if tc.ci >= 0 {
			got = ciAccessMinor(tc.gpu, tc.gi, tc.ci)
		}
		if got != tc.want {
			t.Errorf("gpu%d/gi%d/ci%d: minor %d, want %d", tc.gpu, tc.gi, tc.ci, got, tc.want)
		}
	}
}

func TestWriteDriverRoot(t *testing.T) {
	m := started(t, "dgxa100", WithSeed("node-7"))
	root := t.TempDir()
	for range 2 { // idempotent: plugins call it on every start
		if err := m.WriteDriverRoot(root); err != nil {
			t.Fatal(err)
		}
	}

	// A MIG device created after the driver root was written gets its capability nodes.
	d := migGPU(t, m, 1)
	threeG := profileByID(t, d, 9)
	gi := get(d.CreateGpuInstanceWithPlacement(&threeG, &nvml.GpuInstancePlacement{Start: 4, Size: 4})).must(t, "3g at 4")
	full := get(gi.GetComputeInstanceProfileInfo(2, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)).must(t, "3g CI")
	ci := get(gi.CreateComputeInstance(&full)).must(t, "CI")
	giMinor, ciMinor := giAccessMinor(1, 2), ciAccessMinor(1, 2, 0) // GPU 1, GI 2 (3g at 4), CI 0

	nodes := []string{"nvidia0", "nvidia7", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
		"nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2",
		fmt.Sprintf("nvidia-caps/nvidia-cap%d", giMinor), fmt.Sprintf("nvidia-caps/nvidia-cap%d", ciMinor)}
	if os.Geteuid() != 0 {
		t.Logf("not root: device nodes may be regular files where mknod is not permitted")
	}
	for _, name := range nodes {
		var st syscall.Stat_t
		path := filepath.Join(root, "dev", name)
		if err := syscall.Lstat(path, &st); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFCHR {
			if os.Geteuid() != 0 {
				t.Skipf("not root, %s is not a character device (mknod not permitted)", name)
			}
			t.Errorf("%s is not a character device (mode %o)", name, st.Mode)
		} else if st.Rdev != 1<<8|3 {
			t.Errorf("%s has device number %#x, want 1:3", name, st.Rdev)
		}
	}
	if info, err := os.Stat(filepath.Join(root, "dev", "nvidia8")); err == nil {
		t.Errorf("dev/nvidia8 exists on an 8-GPU machine: %v", info.Mode())
	}

	minors := readLines(t, filepath.Join(root, "proc/driver/nvidia-caps/mig-minors"))
	wantMinors := []string{"config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4", "gpu0/gi1/access 12",
		"gpu1/gi0/access 138", "gpu31/gi14/ci7/access 4322"}
	for _, line := range wantMinors {
		if !minors[line] {
			t.Errorf("mig-minors lacks %q", line)
		}
	}
	if len(minors) != 2+32*15*9 {
		t.Errorf("mig-minors has %d lines, want %d", len(minors), 2+32*15*9)
	}
	ciCap := filepath.Join(root, "proc/driver/nvidia/capabilities/gpu1/mig/gi2/ci0/access")
	caps, err := os.ReadFile(ciCap)
	if err != nil || string(caps) != fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", ciMinor) {
		t.Errorf("compute instance capability file: %q, %v", caps, err)
	}
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, err := os.Stat(filepath.Dir(ciCap)); err == nil {
		t.Errorf("capability files of destroyed instances remain")
	}
	if _, err := os.Stat(filepath.Join(root, "proc/driver/nvidia/capabilities/mig/config")); err != nil {
		t.Errorf("mig/config capability: %v", err)
	}
	info, err := os.ReadFile(filepath.Join(root, "proc/driver/nvidia/gpus/0000:47:00.0/information"))
	if err != nil || !strings.Contains(string(info), "Device Minor: \t 2") || !strings.Contains(string(info), m.GPUUUID(2)) {
		t.Errorf("GPU 2 information: %q, %v", info, err)
	}

	libDir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	for link, target := range map[string]string{
		"libcuda.so.1":                  "libcuda.so.550.54.15",
		"libnvidia-ml.so.1":             "libnvidia-ml.so.550.54.15",
		"libnvidia-ptxjitcompiler.so.1": "libnvidia-ptxjitcompiler.so.550.54.15",
		"libnvidia-nvvm.so.4":           "libnvidia-nvvm.so.550.54.15",
		"libcudadebugger.so.1":          "libcudadebugger.so.550.54.15",
		"libcuda.so":                    "libcuda.so.1",
	} {
		if got, err := os.Readlink(filepath.Join(libDir, link)); err != nil || got != target {
			t.Errorf("%s -> %q (%v), want %s", link, got, err, target)
		}
		if _, err := os.Stat(filepath.Join(libDir, link)); err != nil {
			t.Errorf("%s: dangling: %v", link, err)
		}
	}
	for _, bin := range []string{"nvidia-smi", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-debugdump", "nvidia-persistenced"} {
		st, err := os.Stat(filepath.Join(root, "usr/bin", bin))
		if err != nil || st.Mode()&0o111 == 0 {
			t.Errorf("usr/bin/%s: %v, %v", bin, st, err)
		}
	}
}

func readLines(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := map[string]bool{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		lines[s.Text()] = true
	}
	return lines
}

// shells returns the POSIX shells available to run the nvidia-smi script with.
func shells(t *testing.T) [][]string {
	var out [][]string
	if p, err := exec.LookPath("busybox"); err == nil {
		out = append(out, []string{p, "sh"})
	}
	if p, err := exec.LookPath("sh"); err == nil {
		out = append(out, []string{p})
	}
	if len(out) == 0 {
		t.Skip("no POSIX shell to run the nvidia-smi script")
	}
	return out
}

func TestNvidiaSMIScript(t *testing.T) {
	m := started(t, "dgxh100", WithSeed("node-3"))
	root := t.TempDir()
	if err := m.WriteDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	d := migGPU(t, m, 1)
	twoG := profileByID(t, d, 14)
	for range 2 {
		gi := get(d.CreateGpuInstance(&twoG)).must(t, "2g")
		full := get(gi.GetComputeInstanceProfileInfo(1, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)).must(t, "2g CI")
		get(gi.CreateComputeInstance(&full)).must(t, "CI")
	}
	mig0 := get(get(d.GetMigDeviceHandleByIndex(0)).must(t, "MIG 0").GetUUID()).must(t, "UUID")
	mig1 := get(get(d.GetMigDeviceHandleByIndex(1)).must(t, "MIG 1").GetUUID()).must(t, "UUID")
	gpu := func(i int) string { return m.GPUUUID(i) }

	tests := []struct {
		name    string
		env     []string // nil: NVIDIA_VISIBLE_DEVICES unset
		args    []string
		want    []string
		notWant []string
		code    int
	}{
		{"all by default", nil, []string{"-L"},
			[]string{"GPU 0: NVIDIA H100 80GB HBM3 (UUID: " + gpu(0) + ")", "GPU 7: NVIDIA H100 80GB HBM3 (UUID: " + gpu(7) + ")",
				"  MIG 2g.20gb     Device  0: (UUID: " + mig0 + ")", "  MIG 2g.20gb     Device  1: (UUID: " + mig1 + ")"}, nil, 0},
		{"two GPUs renumbered", []string{"NVIDIA_VISIBLE_DEVICES=" + gpu(5) + "," + gpu(3)}, []string{"-L"},
			[]string{"GPU 0: NVIDIA H100 80GB HBM3 (UUID: " + gpu(3) + ")", "GPU 1: NVIDIA H100 80GB HBM3 (UUID: " + gpu(5) + ")"},
			[]string{gpu(0), "GPU 2"}, 0},
		{"one MIG device", []string{"NVIDIA_VISIBLE_DEVICES=" + mig1}, []string{"-L"},
			[]string{"GPU 0: NVIDIA H100 80GB HBM3 (UUID: " + gpu(1) + ")", "  MIG 2g.20gb     Device  0: (UUID: " + mig1 + ")"},
			[]string{mig0, gpu(0)}, 0},
		{"all", []string{"NVIDIA_VISIBLE_DEVICES=all"}, []string{"-L"}, []string{gpu(6)}, nil, 0},
		{"none", []string{"NVIDIA_VISIBLE_DEVICES=void"}, []string{"-L"}, []string{"No devices were found"}, []string{gpu(0)}, 6},
		{"table", []string{"NVIDIA_VISIBLE_DEVICES=" + gpu(1)}, nil,
			[]string{"Driver Version: 550.54.15", "CUDA Version: 12.4", "NVIDIA H100 80GB HBM3", "00000000:2A:00.0", "81559MiB", "Enabled", "No running processes found"},
			[]string{"00000000:18:00.0"}, 0},
		{"unsupported", nil, []string{"-q"}, nil, nil, 2},
	}
	script := filepath.Join(root, "usr/bin/nvidia-smi")
	for _, sh := range shells(t) {
		for _, tc := range tests {
			t.Run(filepath.Base(sh[0])+"/"+tc.name, func(t *testing.T) {
				cmd := exec.Command(sh[0], append(append(sh[1:], script), tc.args...)...)
				cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, tc.env...)
				out, err := cmd.CombinedOutput()
				code := 0
				if exit, ok := err.(*exec.ExitError); ok {
					code = exit.ExitCode()
				} else if err != nil {
					t.Fatal(err)
				}
				if code != tc.code {
					t.Fatalf("exit code %d, want %d; output:\n%s", code, tc.code, out)
				}
				for _, w := range tc.want {
					if !strings.Contains(string(out), w) {
						t.Errorf("output lacks %q:\n%s", w, out)
					}
				}
				for _, w := range tc.notWant {
					if strings.Contains(string(out), w) {
						t.Errorf("output has %q:\n%s", w, out)
					}
				}
			})
		}
	}
}
