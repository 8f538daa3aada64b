package sharing

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/mpscontrol"
)

// simControlDir holds the simulated nvidia-cuda-mps-control that
// controlBinary builds, once per test binary; TestMain removes it.
var (
	simControlDir  string
	simControlOnce sync.Once
	simControlPath string
	simControlErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mps-control-sim")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	simControlDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// controlBinary returns the simulated nvidia-cuda-mps-control
// (cmd/mps-control-sim) installed the way a simulated driver root installs
// it: usr/bin/nvidia-cuda-mps-control, a symlink to the binary. It builds the
// binary on its first call.
func controlBinary(t *testing.T) string {
	t.Helper()
	simControlOnce.Do(func() {
		binary := filepath.Join(simControlDir, "mps-control-sim")
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		build := exec.Command(goBin, "build", "-o", binary, "github.com/gpu-dra/gpu-dra-driver/cmd/mps-control-sim")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			simControlErr = fmt.Errorf("build cmd/mps-control-sim: %w\n%s", err, out)
			return
		}
		link := filepath.Join(simControlDir, "usr", "bin", "nvidia-cuda-mps-control")
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			simControlErr = err
			return
		}
		if err := os.Symlink(binary, link); err != nil {
			simControlErr = err
			return
		}
		simControlPath = link
	})
	if simControlErr != nil {
		t.Fatal(simControlErr)
	}
	return simControlPath
}

// mpsTest is an MPS manager over a simulated machine and the simulated
// control program.
type mpsTest struct {
	sim *nvmlsim.Machine
	dir string
	mgr *MPSManager
}

// newMPSTest returns a manager in a new, short directory (unix sockets live
// below it). Daemons still running at the end of the test are killed.
func newMPSTest(t *testing.T, machine string, opts MPSOptions) *mpsTest {
	t.Helper()
	dir, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	mt := &mpsTest{sim: newSim(t, machine), dir: dir}
	t.Cleanup(func() {
		for _, name := range dirEntries(t, dir) {
			if pid := daemonPID(filepath.Join(dir, name)); pid > 0 && mt.mgr.isControlProcess(pid, filepath.Join(dir, name, "pipe")) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(dir)
	})
	mt.mgr = mt.newManager(t, opts)
	return mt
}

// newManager returns another manager over the same directory, as a
// restarted plugin creates.
func (mt *mpsTest) newManager(t *testing.T, opts MPSOptions) *MPSManager {
	t.Helper()
	opts.Dir = mt.dir
	opts.ControlBinary = controlBinary(t)
	opts.ComputeModes = NewNVMLComputeModes(mt.sim)
	mgr, err := NewMPSManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	return mgr
}

func (mt *mpsTest) acquire(t *testing.T, dev DeviceRef, share MPSShare) *Result {
	t.Helper()
	res, err := mt.mgr.Acquire(testContext(t), dev, share)
	if err != nil {
		t.Fatalf("Acquire(%s): %v", share.ID, err)
	}
	return res
}

func (mt *mpsTest) release(t *testing.T, dev DeviceRef, share string) {
	t.Helper()
	if err := mt.mgr.Release(testContext(t), dev, share); err != nil {
		t.Fatalf("Release(%s): %v", share, err)
	}
}

// pid is the PID of the device's running daemon; 0 when none runs.
func (mt *mpsTest) pid(dev DeviceRef) int {
	pid, running, _ := mt.mgr.daemonStatus(mt.mgr.paths(dev.UUID), 0)
	if !running {
		return 0
	}
	return pid
}

// controlLog is the device's control.log, as lines without the time stamp
// prefix.
func (mt *mpsTest) controlLog(t *testing.T, dev DeviceRef) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(mt.mgr.paths(dev.UUID).log, "control.log"))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		_, line, _ := strings.Cut(s.Text(), "] ")
		lines = append(lines, line)
	}
	return lines
}

// commands are the commands in the device's control.log.
func (mt *mpsTest) commands(t *testing.T, dev DeviceRef) []string {
	t.Helper()
	var cmds []string
	for _, line := range mt.controlLog(t, dev) {
		if cmd, ok := strings.CutPrefix(line, "Cmd:"); ok {
			cmds = append(cmds, cmd)
		}
	}
	return cmds
}

// starts are the daemon start lines in the device's control.log.
func (mt *mpsTest) starts(t *testing.T, dev DeviceRef) []string {
	t.Helper()
	var starts []string
	for _, line := range mt.controlLog(t, dev) {
		if strings.HasPrefix(line, "Starting control daemon") {
			starts = append(starts, line)
		}
	}
	return starts
}

func daemonPID(deviceDir string) int {
	data, err := os.ReadFile(filepath.Join(deviceDir, "pipe", pidFileName))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

// sessionID reads a process's session from /proc.
func sessionID(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(data), ')')
	fields := strings.Fields(string(data[i+2:]))
	sid, err := strconv.Atoi(fields[3]) // state ppid pgrp session
	if err != nil {
		t.Fatal(err)
	}
	return sid
}

// killDaemon kills a device's daemon as a crash would, leaving its pid file
// and socket behind.
func killDaemon(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitExit(testContext(t), pid, 5*time.Second) {
		t.Fatalf("daemon %d survived SIGKILL", pid)
	}
}

func quantity(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// TestMPSLifecycle starts a daemon on the first share with the config's
// defaults, reuses it for the second share and stops it after the last.
func TestMPSLifecycle(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{})
	gpu := gpuRef(mt.sim, 3)
	cfg := &gpuv1beta1.MPSConfig{
		DefaultActiveThreadPercentage:  ptrTo(50),
		DefaultPinnedDeviceMemoryLimit: quantity("8Gi"),
		DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{
			gpu.UUID: resource.MustParse("12Gi"),
		},
		ClientPriority: ptrTo(gpuv1beta1.BelowNormalMPSClientPriority),
	}
	pipeDir := filepath.Join(mt.dir, dirName(gpu.UUID), "pipe")

	res := mt.acquire(t, gpu, MPSShare{ID: "a", Config: cfg, Capacity: ShareCapacity{ComputePercent: 25, MemoryBytes: 20 << 30}})
	want := &Result{
		Strategy: gpuv1beta1.MPSStrategy,
		UUID:     gpu.UUID,
		PipeDir:  pipeDir,
		// The pinned limit its clients get, for telemetry.
		MemoryLimitBytes: 12 << 30,
		Edits: ContainerEdits{
			Env: []string{
				"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
				"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
				"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=12288M",
				"CUDA_MPS_CLIENT_PRIORITY=1",
			},
			// Read-only: clients connect to sockets there but must not
			// replace what the plugin and daemon trust (the pid file, the
			// control socket).
			Mounts: []cdi.Mount{{HostPath: pipeDir, ContainerPath: "/tmp/nvidia-mps", ReadOnly: true}},
		},
	}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("first share's result (-want +got):\n%s", diff)
	}
	pid := mt.pid(gpu)
	if pid == 0 {
		t.Fatal("no daemon after the first share")
	}
	if sid := sessionID(t, pid); sid == sessionID(t, os.Getpid()) {
		t.Errorf("daemon %d is in the plugin's session %d; it must have its own", pid, sid)
	}
	if starts := mt.starts(t, gpu); len(starts) != 1 || !strings.Contains(starts[0], "CUDA_VISIBLE_DEVICES="+gpu.UUID) {
		t.Errorf("daemon starts = %q, want one with CUDA_VISIBLE_DEVICES=%s", starts, gpu.UUID)
	}
	wantCmds := []string{
		"set_default_active_thread_percentage 50",
		"set_default_device_pinned_mem_limit " + gpu.UUID + " 12288M",
	}
	if diff := cmp.Diff(wantCmds, mt.commands(t, gpu)); diff != "" {
		t.Errorf("daemon commands (-want +got):\n%s", diff)
	}
	if got := computeModeOf(t, mt.sim, 3); got != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("compute mode = %v, want EXCLUSIVE_PROCESS", got)
	}
	// The daemon kept what it was told (through the control client).
	if out, err := mt.mgr.control(testContext(t), mt.mgr.paths(gpu.UUID), "get_default_device_pinned_mem_limit "+gpu.UUID); err != nil || out != "12288M" {
		t.Errorf("pinned memory limit in the daemon = %q, %v", out, err)
	}

	res = mt.acquire(t, gpu, MPSShare{ID: "b", Config: cfg})
	if len(res.Warnings) != 0 || mt.pid(gpu) != pid || len(mt.starts(t, gpu)) != 1 {
		t.Errorf("second share: warnings %q, pid %d (was %d), %d starts; want the same daemon", res.Warnings, mt.pid(gpu), pid, len(mt.starts(t, gpu)))
	}
	mt.release(t, gpu, "a")
	if mt.pid(gpu) != pid {
		t.Errorf("daemon gone while share b is prepared")
	}
	mt.release(t, gpu, "b")
	if processRunning(pid) {
		t.Errorf("daemon %d runs after the last share", pid)
	}
	if cmds := mt.commands(t, gpu); cmds[len(cmds)-1] != "quit" {
		t.Errorf("last daemon command = %q, want quit", cmds[len(cmds)-1])
	}
	if got := computeModeOf(t, mt.sim, 3); got != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("compute mode after the last share = %v, want DEFAULT", got)
	}
	if names := dirEntries(t, filepath.Join(mt.dir, dirName(gpu.UUID))); !slices.Equal(names, []string{"log"}) {
		t.Errorf("device directory after the last share holds %v, want only the logs", names)
	}
	mt.release(t, gpu, "b") // repeated: nothing to do
}

// TestMPSIndexKeyLimit checks, through the manager, that a per-device
// limit keyed by index 0 reaches the client's environment and the daemon,
// as the driver passes shares: the key is the device's CUDA
// ordinal in the containers, which is always 0.
func TestMPSIndexKeyLimit(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{})
	gpu := gpuRef(mt.sim, 1)
	cfg := &gpuv1beta1.MPSConfig{
		DefaultPinnedDeviceMemoryLimit:    quantity("8Gi"),
		DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{"0": resource.MustParse("6Gi")},
	}
	res := mt.acquire(t, gpu, MPSShare{ID: "a", Config: cfg, Capacity: ShareCapacity{MemoryBytes: 20 << 30}})
	if !slices.Contains(res.Edits.Env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=6144M") {
		t.Errorf("client env %q lacks CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=6144M", res.Edits.Env)
	}
	if out, err := mt.mgr.control(testContext(t), mt.mgr.paths(gpu.UUID), "get_default_device_pinned_mem_limit "+gpu.UUID); err != nil || out != "6144M" {
		t.Errorf("pinned memory limit in the daemon = %q, %v; want 6144M", out, err)
	}
	mt.release(t, gpu, "a")
}

// TestMPSLimitsFromCapacity checks that a share without configured limits
// gets limits from its capacity, in its environment only.
func TestMPSLimitsFromCapacity(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{ContainerPipeDir: "/run/mps"})
	gpu := gpuRef(mt.sim, 0)
	cfg := &gpuv1beta1.MPSConfig{ClientPriority: ptrTo(gpuv1beta1.NormalMPSClientPriority)}
	res := mt.acquire(t, gpu, MPSShare{ID: "a", Config: cfg, Capacity: ShareCapacity{ComputePercent: 25, MemoryBytes: 20 << 30}})
	wantEnv := []string{
		"CUDA_MPS_PIPE_DIRECTORY=/run/mps",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
		"CUDA_MPS_CLIENT_PRIORITY=0",
	}
	if diff := cmp.Diff(wantEnv, res.Edits.Env); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
	if cmds := mt.commands(t, gpu); len(cmds) != 0 {
		t.Errorf("daemon got commands %q; a config without limits sets no defaults", cmds)
	}
	// Another share with another capacity gets its own limits, no warning.
	res = mt.acquire(t, gpu, MPSShare{ID: "b", Capacity: ShareCapacity{ComputePercent: 75, MemoryBytes: 60 << 30}})
	if len(res.Warnings) != 0 || !slices.Contains(res.Edits.Env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=75") ||
		!slices.Contains(res.Edits.Env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=61440M") {
		t.Errorf("second share: env %q, warnings %q", res.Edits.Env, res.Warnings)
	}
	mt.release(t, gpu, "a")
	mt.release(t, gpu, "b")
}

// TestMPSEdits checks the limits of a share: config over capacity, UUID key
// over index key over the default.
func TestMPSEdits(t *testing.T) {
	gpu := DeviceRef{UUID: "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c"}
	mig := DeviceRef{UUID: "MIG-9a7c1c4e-7d2b-5f37-a1b0-0c5a3e2f6d11", ParentUUID: gpu.UUID}
	tests := map[string]struct {
		dev          DeviceRef
		share        MPSShare
		wantEnv      []string
		wantCommands []string
		wantErr      bool
	}{
		"nothing": {
			dev: gpu, share: MPSShare{},
			wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"},
		},
		"capacity": {
			dev: gpu, share: MPSShare{Capacity: ShareCapacity{ComputePercent: 10, MemoryBytes: 1 << 30}},
			wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M"},
		},
		// The capacity's step is 1Mi; anything else is refused, not cut.
		"capacity of a fraction of a mebibyte": {
			dev: gpu, share: MPSShare{Capacity: ShareCapacity{MemoryBytes: 1<<30 + 1<<19}},
			wantErr: true,
		},
		"config over capacity": {
			dev: gpu,
			share: MPSShare{
				Config:   &gpuv1beta1.MPSConfig{DefaultActiveThreadPercentage: ptrTo(40), DefaultPinnedDeviceMemoryLimit: quantity("2Gi")},
				Capacity: ShareCapacity{ComputePercent: 10, MemoryBytes: 1 << 30},
			},
			wantEnv:      []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M"},
			wantCommands: []string{"set_default_active_thread_percentage 40", "set_default_device_pinned_mem_limit " + gpu.UUID + " 2048M"},
		},
		// Index 0 is the device's CUDA ordinal in the containers.

		"index key over default": {
			dev: gpu,
			share: MPSShare{
				Config: &gpuv1beta1.MPSConfig{
					DefaultPinnedDeviceMemoryLimit:    quantity("2Gi"),
					DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{"0": resource.MustParse("5Gi")},
				},
			},
			wantEnv:      []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=5120M"},
			wantCommands: []string{"set_default_device_pinned_mem_limit " + gpu.UUID + " 5120M"},
		},
		"UUID key over index key": {
			dev: mig,
			share: MPSShare{
				Config: &gpuv1beta1.MPSConfig{
					DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{"0": resource.MustParse("3Gi"), mig.UUID: resource.MustParse("4Gi")},
				},
			},
			wantEnv:      []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M"},
			wantCommands: []string{"set_default_device_pinned_mem_limit " + mig.UUID + " 4096M"},
		},
		"UUID key of another device": {
			dev: gpu,
			share: MPSShare{
				Config: &gpuv1beta1.MPSConfig{DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{mig.UUID: resource.MustParse("3Gi")}},
			},
			wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"},
		},
		"capacity over 100 percent": {
			dev: gpu, share: MPSShare{Capacity: ShareCapacity{ComputePercent: 150}},
			wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"},
		},
		"invalid percentage": {
			dev: gpu, share: MPSShare{Config: &gpuv1beta1.MPSConfig{DefaultActiveThreadPercentage: ptrTo(0)}},
			wantErr: true,
		},
		"limit below 1Mi": {
			dev: gpu, share: MPSShare{Config: &gpuv1beta1.MPSConfig{DefaultPinnedDeviceMemoryLimit: quantity("1000Ki")}},
			wantErr: true,
		},
		// Validate refuses these; the manager does not round them either.
		"limit of a fraction of a mebibyte": {
			dev: gpu, share: MPSShare{Config: &gpuv1beta1.MPSConfig{DefaultPinnedDeviceMemoryLimit: quantity("1536Ki")}},
			wantErr: true,
		},
		"per-device limit of a fraction of a byte": {
			dev: gpu, share: MPSShare{Config: &gpuv1beta1.MPSConfig{DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{"0": resource.MustParse("1048576.5")}}},
			wantErr: true,
		},
		"invalid priority": {
			dev: gpu, share: MPSShare{Config: &gpuv1beta1.MPSConfig{ClientPriority: ptrTo(gpuv1beta1.MPSClientPriority("High"))}},
			wantErr: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			edits, err := clientEdits(tc.dev, tc.share, "/host/pipe", DefaultContainerPipeDir)
			if (err != nil) != tc.wantErr {
				t.Fatalf("clientEdits: %v, want error %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if diff := cmp.Diff(tc.wantEnv, edits.Env); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]cdi.Mount{{HostPath: "/host/pipe", ContainerPath: "/tmp/nvidia-mps"}}, edits.Mounts); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			settings, err := daemonSettings(tc.dev, tc.share)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantCommands, settings.commands(tc.dev.UUID)); diff != "" {
				t.Errorf("daemon commands (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMPSMIGDevice checks that a MIG device gets its own daemon and that
// the parent GPU's compute mode stays as it is.
func TestMPSMIGDevice(t *testing.T) {
	mt := newMPSTest(t, "dgxa100", MPSOptions{})
	mig := migRef(mt.sim, 2)
	gpu := gpuRef(mt.sim, 2)
	cfg := &gpuv1beta1.MPSConfig{DefaultPinnedDeviceMemoryLimit: quantity("4Gi")}
	mt.acquire(t, mig, MPSShare{ID: "a", Config: cfg})
	if starts := mt.starts(t, mig); len(starts) != 1 || !strings.Contains(starts[0], "CUDA_VISIBLE_DEVICES="+mig.UUID) {
		t.Errorf("daemon starts = %q, want one with CUDA_VISIBLE_DEVICES=%s", starts, mig.UUID)
	}
	if diff := cmp.Diff([]string{"set_default_device_pinned_mem_limit " + mig.UUID + " 4096M"}, mt.commands(t, mig)); diff != "" {
		t.Errorf("commands (-want +got):\n%s", diff)
	}
	if got := computeModeOf(t, mt.sim, 2); got != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("parent compute mode = %v, want DEFAULT (untouched)", got)
	}
	if mt.pid(gpu) != 0 {
		t.Error("a daemon for the parent GPU")
	}
	mt.release(t, mig, "a")
	if mt.pid(mig) != 0 {
		t.Error("daemon runs after the last share")
	}
}

// TestMPSConflictingDefaults checks that the daemon keeps its first share's
// defaults and a later share with other defaults gets a warning.
func TestMPSConflictingDefaults(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{})
	gpu := gpuRef(mt.sim, 1)
	mt.acquire(t, gpu, MPSShare{ID: "a", Config: &gpuv1beta1.MPSConfig{DefaultActiveThreadPercentage: ptrTo(50)}})
	pid := mt.pid(gpu)
	res := mt.acquire(t, gpu, MPSShare{ID: "b", Config: &gpuv1beta1.MPSConfig{DefaultActiveThreadPercentage: ptrTo(30)}})
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "first share") {
		t.Errorf("warnings = %q, want one about the first share's defaults", res.Warnings)
	}
	if !slices.Contains(res.Edits.Env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30") {
		t.Errorf("env %q lacks the share's own percentage", res.Edits.Env)
	}
	if mt.pid(gpu) != pid || len(mt.starts(t, gpu)) != 1 {
		t.Error("daemon restarted for a later share")
	}
	if diff := cmp.Diff([]string{"set_default_active_thread_percentage 50"}, mt.commands(t, gpu)); diff != "" {
		t.Errorf("commands (-want +got):\n%s", diff)
	}
}

// TestMPSReadoption checks a plugin restart: a new manager over the same
// directory adopts a running daemon, restarts a dead one with its recorded
// defaults, and stops the daemon of a device without shares.
func TestMPSReadoption(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{})
	gpu0, gpu1, gpu2 := gpuRef(mt.sim, 0), gpuRef(mt.sim, 1), gpuRef(mt.sim, 2)
	cfg := &gpuv1beta1.MPSConfig{DefaultActiveThreadPercentage: ptrTo(40)}
	mt.acquire(t, gpu0, MPSShare{ID: "a", Config: cfg})
	mt.acquire(t, gpu1, MPSShare{ID: "b", Config: cfg})
	mt.acquire(t, gpu2, MPSShare{ID: "c", Config: cfg})
	pid0, pid1, pid2 := mt.pid(gpu0), mt.pid(gpu1), mt.pid(gpu2)
	killDaemon(t, pid1) // crashed while the plugin was down

	mt.mgr = mt.newManager(t, MPSOptions{})
	live := []ShareRef{{Device: gpu0, ID: "a"}, {Device: gpu1, ID: "b"}}
	if err := mt.mgr.Reconcile(testContext(t), live); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if mt.pid(gpu0) != pid0 || len(mt.starts(t, gpu0)) != 1 {
		t.Errorf("GPU 0: pid %d (was %d), %d starts; want the running daemon adopted", mt.pid(gpu0), pid0, len(mt.starts(t, gpu0)))
	}
	if p := mt.pid(gpu1); p == 0 || p == pid1 || len(mt.starts(t, gpu1)) != 2 {
		t.Errorf("GPU 1: pid %d (dead one %d), %d starts; want a new daemon", p, pid1, len(mt.starts(t, gpu1)))
	}
	want := []string{"set_default_active_thread_percentage 40", "set_default_active_thread_percentage 40"}
	if diff := cmp.Diff(want, mt.commands(t, gpu1)); diff != "" {
		t.Errorf("GPU 1 commands: the restarted daemon must get the recorded defaults again (-want +got):\n%s", diff)
	}
	if processRunning(pid2) || mt.pid(gpu2) != 0 {
		t.Errorf("GPU 2 without shares: daemon %d still runs", pid2)
	}
	if got := computeModeOf(t, mt.sim, 2); got != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("GPU 2 compute mode = %v, want DEFAULT restored", got)
	}
	if got := computeModeOf(t, mt.sim, 1); got != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("GPU 1 compute mode = %v, want EXCLUSIVE_PROCESS", got)
	}

	// Reconcile again (another restart) changes nothing.
	pid1 = mt.pid(gpu1)
	if err := mt.newManager(t, MPSOptions{}).Reconcile(testContext(t), live); err != nil {
		t.Fatalf("second Reconcile: %v", err)
	}
	if mt.pid(gpu0) != pid0 || mt.pid(gpu1) != pid1 {
		t.Error("second Reconcile replaced a running daemon")
	}
	mt.release(t, gpu0, "a")
	mt.release(t, gpu1, "b")
	for i := range 3 {
		if got := computeModeOf(t, mt.sim, i); got != nvml.COMPUTEMODE_DEFAULT {
			t.Errorf("GPU %d compute mode = %v at the end, want DEFAULT", i, got)
		}
	}
}

// TestMPSReconcileWithoutState checks that a live share whose device has no
// state (lost) gets a daemon, without defaults.
func TestMPSReconcileWithoutState(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{})
	gpu := gpuRef(mt.sim, 6)
	if err := mt.mgr.Reconcile(testContext(t), []ShareRef{{Device: gpu, ID: "a"}, {Device: gpu, ID: "b"}}); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if mt.pid(gpu) == 0 || len(mt.commands(t, gpu)) != 0 {
		t.Errorf("pid %d, commands %q; want a daemon without defaults", mt.pid(gpu), mt.commands(t, gpu))
	}
	mt.release(t, gpu, "a")
	if mt.pid(gpu) == 0 {
		t.Error("daemon stopped while share b is live")
	}
	mt.release(t, gpu, "b")
	if mt.pid(gpu) != 0 {
		t.Error("daemon runs after the last share")
	}
}

// TestMPSDeadDaemonRestartedOnAcquire checks that a share joining a device
// whose daemon died starts it again.
func TestMPSDeadDaemonRestartedOnAcquire(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{})
	gpu := gpuRef(mt.sim, 5)
	mt.acquire(t, gpu, MPSShare{ID: "a"})
	killDaemon(t, mt.pid(gpu))
	mt.acquire(t, gpu, MPSShare{ID: "b"})
	if mt.pid(gpu) == 0 || len(mt.starts(t, gpu)) != 2 {
		t.Errorf("pid %d, %d starts; want a restarted daemon", mt.pid(gpu), len(mt.starts(t, gpu)))
	}
	mt.release(t, gpu, "a")
	mt.release(t, gpu, "b")
	if mt.pid(gpu) != 0 {
		t.Error("daemon runs after the last share")
	}
}

// TestMPSStopKillsStuckDaemon checks that a daemon that ignores quit is
// terminated.
func TestMPSStopKillsStuckDaemon(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{Env: []string{mpscontrol.EnvIgnoreQuit + "=1"}, StopTimeout: 200 * time.Millisecond})
	gpu := gpuRef(mt.sim, 7)
	mt.acquire(t, gpu, MPSShare{ID: "a"})
	pid := mt.pid(gpu)
	mt.release(t, gpu, "a")
	if processRunning(pid) {
		t.Fatalf("daemon %d survived the release", pid)
	}
	log := mt.controlLog(t, gpu)
	if len(log) < 2 || log[len(log)-2] != "Cmd:quit" || !strings.HasPrefix(log[len(log)-1], "Exit on terminated") {
		t.Errorf("control.log ends with %q, want quit and then SIGTERM", log)
	}
}

// TestMPSStartFailure checks that a daemon that fails to start fails the
// preparation with its output and leaves the GPU as it was.
func TestMPSStartFailure(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{Env: []string{mpscontrol.EnvFailStart + "=1"}})
	gpu := gpuRef(mt.sim, 4)
	_, err := mt.mgr.Acquire(testContext(t), gpu, MPSShare{ID: "a"})
	if err == nil || !strings.Contains(err.Error(), mpscontrol.EnvFailStart) {
		t.Fatalf("Acquire = %v, want the daemon's output in the error", err)
	}
	if got := computeModeOf(t, mt.sim, 4); got != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("compute mode = %v, want DEFAULT restored", got)
	}
	if _, err := os.Stat(mt.mgr.paths(gpu.UUID).state); !os.IsNotExist(err) {
		t.Errorf("state left after failed start: %v", err)
	}
	mt.release(t, gpu, "a") // the prepare path's rollback: nothing to do
}

// TestNewMPSManagerValidates checks the options.
func TestNewMPSManagerValidates(t *testing.T) {
	m := newSim(t, "l4x4")
	base := MPSOptions{Dir: "/var/lib/kubelet/plugins/gpu.dra.dev/mps", ControlBinary: controlBinary(t), ComputeModes: NewNVMLComputeModes(m)}
	long := base
	long.Dir = "/var/lib/kubelet/plugins/gpu.dra.dev/some/deeply/nested/dir/for/mps"
	relative := base
	relative.Dir = "mps"
	noBinary := base
	noBinary.ControlBinary = ""
	for name, opts := range map[string]MPSOptions{"too long": long, "relative": relative, "no binary": noBinary} {
		if _, err := NewMPSManager(opts); err == nil {
			t.Errorf("%s: NewMPSManager accepted %+v", name, opts)
		}
	}
}

// TestMPSConcurrent acquires and releases shares of several devices from
// many goroutines (run with -race): one daemon per device, none left.
func TestMPSConcurrent(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{})
	ctx := testContext(t)
	const gpus, shares = 4, 3
	var wg sync.WaitGroup
	errs := make(chan error, gpus*shares*2)
	for g := range gpus {
		for s := range shares {
			wg.Go(func() {
				if _, err := mt.mgr.Acquire(ctx, gpuRef(mt.sim, g), MPSShare{ID: fmt.Sprintf("share-%d", s)}); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	for g := range gpus {
		if starts := mt.starts(t, gpuRef(mt.sim, g)); len(starts) != 1 {
			t.Errorf("GPU %d: %d daemon starts, want 1", g, len(starts))
		}
	}
	for g := range gpus {
		for s := range shares {
			wg.Go(func() {
				if err := mt.mgr.Release(ctx, gpuRef(mt.sim, g), fmt.Sprintf("share-%d", s)); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for g := range gpus {
		if mt.pid(gpuRef(mt.sim, g)) != 0 {
			t.Errorf("GPU %d: daemon runs after its last share", g)
		}
		if got := computeModeOf(t, mt.sim, g); got != nvml.COMPUTEMODE_DEFAULT {
			t.Errorf("GPU %d: compute mode %v, want DEFAULT", g, got)
		}
	}
}

// TestMPSFailedRestoreIsRetried checks that a teardown that could not
// restore the compute mode is finished by the next Release, or by the
// device's next first share before its own set-up.
func TestMPSFailedRestoreIsRetried(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{})
	gpu := gpuRef(mt.sim, 2)
	for _, next := range []string{"release", "acquire"} {
		t.Run(next, func(t *testing.T) {
			mt.acquire(t, gpu, MPSShare{ID: "a"})
			pid := mt.pid(gpu)
			mt.sim.InjectError("SetComputeMode", 2, nvml.ERROR_UNKNOWN, 1)
			if err := mt.mgr.Release(testContext(t), gpu, "a"); err == nil {
				t.Fatal("Release succeeded although the compute mode could not be restored")
			}
			if processRunning(pid) {
				t.Errorf("daemon %d runs after the failed release", pid)
			}
			if next == "release" {
				mt.release(t, gpu, "a")
			} else {
				mt.acquire(t, gpu, MPSShare{ID: "b"})
				if got := computeModeOf(t, mt.sim, 2); got != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
					t.Errorf("compute mode with share b = %v, want EXCLUSIVE_PROCESS", got)
				}
				mt.release(t, gpu, "b")
			}
			if got := computeModeOf(t, mt.sim, 2); got != nvml.COMPUTEMODE_DEFAULT {
				t.Errorf("compute mode at the end = %v, want DEFAULT", got)
			}
			if _, err := os.Stat(mt.mgr.paths(gpu.UUID).state); !os.IsNotExist(err) {
				t.Errorf("state left: %v", err)
			}
		})
	}
}
