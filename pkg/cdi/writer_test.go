package cdi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra-driver/internal/testfs"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const testClaimUID = types.UID("4b0c2b8e-6d1f-4c3a-9e57-0f1d2c3b4a59")

var testClaim = ClaimInfo{UID: testClaimUID, Namespace: "ml", Name: "train-gpus"}

func testDevices() []ClaimDevice {
	return []ClaimDevice{
		{
			Name: "gpu-0",
			DeviceRecord: DeviceRecord{
				Request: "gpus",
				Pool:    "node-a",
				Device:  "gpu-0",
				Kind:    "gpu",
				UUIDs:   []string{"GPU-aaaa"},
			},
			DeviceNodes: []string{"/dev/nvidia0"},
		},
		{
			Name: "gpu-1-mig-1g10gb-21",
			DeviceRecord: DeviceRecord{
				Request: "mig",
				Pool:    "node-a",
				Device:  "gpu-1-mig-1g10gb-21",
				ShareID: "share-7",
				Kind:    "mig",
				UUIDs:   []string{"MIG-bbbb"},
			},
			DeviceNodes: []string{"/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap21"},
			Env:         []string{"CUDA_MPS_PIPE_DIRECTORY=/run/mps"},
			Mounts:      []Mount{{HostPath: testMPSDir, ContainerPath: "/run/mps"}},
			Annotations: map[string]string{"gpu.dra.dev/mig-gi": "13", AnnotationKind: "overridden"},
		},
	}
}

// setup discovers the fake root's driver files and returns a writer for a
// new spec directory.
func setup(t *testing.T, opts ...Option) (*fakeRoot, string, Writer) {
	t.Helper()
	r := newFakeRoot(t)
	files, err := DiscoverDriverFiles(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	specDir := filepath.Join(t.TempDir(), "cdi") // created on first write
	return r, specDir, NewWriter(specDir, r.dir, files, opts...)
}

// inject resolves ids with the CDI library's cache over specDir and applies
// them to a container's OCI spec, as containerd and CRI-O do.
func inject(t *testing.T, specDir string, ids ...string) *oci.Spec {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(specDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.Refresh(); err != nil {
		t.Fatalf("CDI cache refresh: %v", err)
	}
	spec := &oci.Spec{
		Process: &oci.Process{Env: []string{"PATH=/usr/bin:/bin", "LD_LIBRARY_PATH=/opt/app/lib"}},
		Linux:   &oci.Linux{},
	}
	unresolved, err := cache.InjectDevices(spec, ids...)
	if err != nil || len(unresolved) > 0 {
		t.Fatalf("InjectDevices = unresolved %v, %v", unresolved, err)
	}
	return spec
}

func TestWriteClaimSpecAndInject(t *testing.T) {
	ctx := context.Background()
	r, specDir, w := setup(t)

	ids, err := w.WriteClaimSpec(ctx, testClaim, testDevices())
	if err != nil {
		t.Fatalf("WriteClaimSpec: %v", err)
	}
	wantIDs := []string{
		"k8s.gpu.dra.dev/gpu=" + string(testClaimUID) + "-gpu-0",
		"k8s.gpu.dra.dev/gpu=" + string(testClaimUID) + "-gpu-1-mig-1g10gb-21",
	}
	if diff := gocmp.Diff(wantIDs, ids); diff != "" {
		t.Fatalf("CDI IDs (-want +got):\n%s", diff)
	}
	testfs.AssertEntries(t, specDir, "k8s.gpu.dra.dev-gpu_"+string(testClaimUID)+".json")

	t.Run("all devices", func(t *testing.T) {
		spec := inject(t, specDir, ids...)
		assertDevices(t, spec, "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
			"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl")
		assertEnv(t, spec,
			"PATH=/usr/bin:/bin",
			"LD_LIBRARY_PATH=/opt/app/lib", // the image's value survives
			"NVIDIA_VISIBLE_DEVICES=GPU-aaaa,MIG-bbbb",
			"CUDA_MPS_PIPE_DIRECTORY=/run/mps",
		)

		mounts := map[string]oci.Mount{}
		for _, m := range spec.Mounts {
			mounts[m.Destination] = m
		}
		libDir := r.path(r.libDir)
		wantSources := map[string]string{
			"/usr/bin/nvidia-smi":              r.path("/usr/bin/nvidia-smi"),
			"/usr/bin/nvidia-cuda-mps-control": r.path("/opt/nvidia/bin/nvidia-cuda-mps-control"),
		}
		for _, dir := range defaultContainerLibDirs(runtime.GOARCH) {
			for _, lib := range []struct{ linkerName, soname string }{
				{"libcuda.so", "libcuda.so.1"},
				{"libnvidia-ml.so", "libnvidia-ml.so.1"},
				{"libnvidia-nvvm.so", "libnvidia-nvvm.so.4"},
				{"libnvidia-ptxjitcompiler.so", "libnvidia-ptxjitcompiler.so.1"},
			} {
				file := filepath.Join(libDir, lib.linkerName+"."+testDriverVersion)
				for _, name := range []string{lib.linkerName, lib.soname, filepath.Base(file)} {
					wantSources[path.Join(dir, name)] = file
				}
			}
		}
		for dest, src := range wantSources {
			m, ok := mounts[dest]
			if !ok {
				t.Errorf("no mount at %s", dest)
				continue
			}
			if m.Source != src || m.Type != "bind" || !slices.Contains(m.Options, "ro") {
				t.Errorf("mount at %s = %+v, want a read-only bind mount of %s", dest, m, src)
			}
		}
		if m, ok := mounts["/run/mps"]; !ok || m.Source != testMPSDir || slices.Contains(m.Options, "ro") {
			t.Errorf("device mount /run/mps = %+v, want a writable bind mount of %s", m, testMPSDir)
		}
		for dest := range mounts {
			if strings.Contains(dest, "535.104.05") || strings.HasSuffix(dest, "nvidia-debugdump") {
				t.Errorf("unexpected mount at %s", dest)
			}
		}
		if got, want := len(spec.Mounts), len(wantSources)+1; got != want {
			t.Errorf("%d mounts, want %d", got, want)
		}
	})

	t.Run("one device of the claim", func(t *testing.T) {
		spec := inject(t, specDir, ids[0])
		assertDevices(t, spec, "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl")
		for _, e := range spec.Process.Env {
			if strings.HasPrefix(e, "CUDA_MPS_PIPE_DIRECTORY=") {
				t.Errorf("env of the other device injected: %s", e)
			}
		}
	})
}

// A claim of passthrough devices gets its VFIO nodes and nothing of the host
// driver (its GPU is on vfio-pci); beside another kind of device it gets the
// driver as any claim.
func TestWriteClaimSpecPassthrough(t *testing.T) {
	ctx := context.Background()
	vfio := ClaimDevice{
		Name:         "gpu-2-vfio",
		DeviceRecord: DeviceRecord{Request: "vm", Pool: "node-a", Device: "gpu-2-vfio", Kind: vocabulary.KindVFIO},
		DeviceNodes:  []string{"/dev/vfio/7", "/dev/vfio/vfio"},
	}
	for _, tc := range []struct {
		name        string
		devices     []ClaimDevice
		wantDevices []string
		wantMounts  bool
	}{
		{"passthrough only", []ClaimDevice{vfio}, []string{"/dev/vfio/7", "/dev/vfio/vfio"}, false},
		{"beside a GPU", []ClaimDevice{vfio, testDevices()[0]},
			[]string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl", "/dev/vfio/7", "/dev/vfio/vfio"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, specDir, w := setup(t)
			r.device("/dev/vfio/7")
			r.device("/dev/vfio/vfio")
			ids, err := w.WriteClaimSpec(ctx, testClaim, tc.devices)
			if err != nil {
				t.Fatalf("WriteClaimSpec: %v", err)
			}
			spec := inject(t, specDir, ids...)
			assertDevices(t, spec, tc.wantDevices...)
			if got := len(spec.Mounts) > 0; got != tc.wantMounts {
				t.Errorf("driver mounts given: %v, want %v (%d mounts)", got, tc.wantMounts, len(spec.Mounts))
			}
		})
	}
}

func TestWriteClaimSpecRewrite(t *testing.T) {
	ctx := context.Background()
	_, specDir, w := setup(t)
	specPath := filepath.Join(specDir, "k8s.gpu.dra.dev-gpu_"+string(testClaimUID)+".json")

	ids1, err := w.WriteClaimSpec(ctx, testClaim, testDevices())
	if err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	ids2, err := w.WriteClaimSpec(ctx, testClaim, testDevices())
	if err != nil {
		t.Fatal(err)
	}
	second, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids1, ids2) || string(first) != string(second) {
		t.Error("rewriting the same claim changed the IDs or the spec")
	}

	// A rewrite with fewer devices replaces the spec.
	ids3, err := w.WriteClaimSpec(ctx, testClaim, testDevices()[:1])
	if err != nil {
		t.Fatal(err)
	}
	if len(ids3) != 1 {
		t.Fatalf("got %d IDs, want 1", len(ids3))
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(specDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if got := cache.ListDevices(); !slices.Equal(got, ids3) {
		t.Errorf("devices after rewrite = %v, want %v", got, ids3)
	}
	testfs.AssertEntries(t, specDir, filepath.Base(specPath))
}

func TestRemoveClaimSpec(t *testing.T) {
	ctx := context.Background()
	_, specDir, w := setup(t)
	if _, err := w.WriteClaimSpec(ctx, testClaim, testDevices()); err != nil {
		t.Fatal(err)
	}
	// A temporary file left by a crash during a write goes too.
	leftover := filepath.Join(specDir, ".k8s.gpu.dra.dev-gpu_"+string(testClaimUID)+".json.tmp-99")
	if err := os.WriteFile(leftover, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent
		if err := w.RemoveClaimSpec(ctx, testClaimUID); err != nil {
			t.Fatalf("RemoveClaimSpec: %v", err)
		}
	}
	testfs.AssertEntries(t, specDir)
	if err := w.RemoveClaimSpec(ctx, "../etc"); err == nil {
		t.Error("RemoveClaimSpec accepted a UID with a path in it")
	}
}

func TestListClaimSpecs(t *testing.T) {
	ctx := context.Background()
	_, specDir, w := setup(t)

	if infos, err := w.ListClaimSpecs(ctx); err != nil || len(infos) != 0 {
		t.Fatalf("ListClaimSpecs of a missing directory = %v, %v; want nothing", infos, err)
	}

	other := ClaimInfo{UID: "0aaa0000-0000-4000-8000-000000000000", Namespace: "default", Name: "single"}
	if _, err := w.WriteClaimSpec(ctx, testClaim, testDevices()); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteClaimSpec(ctx, other, testDevices()[:1]); err != nil {
		t.Fatal(err)
	}
	garbledUID := types.UID("ffff0000-0000-4000-8000-000000000000")
	foreign := map[string]string{
		// Another vendor's spec.
		"nvidia.yaml": "cdiVersion: 0.6.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n  containerEdits:\n    env: [A=1]\n",
		// Named like ours but of another kind: not ours.
		"k8s.gpu.dra.dev-gpu_eeee0000-0000-4000-8000-000000000000.json": `{"cdiVersion":"0.6.0","kind":"example.com/other","devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}`,
		// Ours but garbled: reported with an error.
		"k8s.gpu.dra.dev-gpu_" + string(garbledUID) + ".json": `{"cdiVersion":"0.6.0","kind":"k8s.gpu.d`,
		// An interrupted write.
		".k8s.gpu.dra.dev-gpu_" + string(garbledUID) + ".json.tmp-1": "{",
		"README": "not a spec",
	}
	for name, content := range foreign {
		if err := os.WriteFile(filepath.Join(specDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(specDir, "k8s.gpu.dra.dev-gpu_dddd.json"), 0o755); err != nil {
		t.Fatal(err)
	}

	infos, err := w.ListClaimSpecs(ctx)
	if err != nil {
		t.Fatalf("ListClaimSpecs: %v", err)
	}
	var uids []types.UID
	for _, info := range infos {
		uids = append(uids, info.Claim.UID)
	}
	if diff := gocmp.Diff([]types.UID{other.UID, testClaimUID, garbledUID}, uids); diff != "" {
		t.Fatalf("listed claims (-want +got):\n%s", diff)
	}
	if infos[2].Err == nil {
		t.Error("garbled spec listed without an error")
	}
	if infos[0].Err != nil || infos[1].Err != nil {
		t.Errorf("valid specs listed with errors: %v, %v", infos[0].Err, infos[1].Err)
	}

	// Everything needed to rebuild the checkpoint round-trips.
	got := infos[1]
	if got.Claim != testClaim {
		t.Errorf("claim = %+v, want %+v", got.Claim, testClaim)
	}
	devs := testDevices()
	want := []ClaimSpecDevice{
		{
			ID:   "k8s.gpu.dra.dev/gpu=" + string(testClaimUID) + "-gpu-0",
			Name: "gpu-0",
			DeviceRecord: DeviceRecord{
				Request: "gpus", Pool: "node-a", Device: "gpu-0", Kind: "gpu",
				UUIDs: []string{"GPU-aaaa"},
			},
		},
		{
			ID:   "k8s.gpu.dra.dev/gpu=" + string(testClaimUID) + "-" + devs[1].Name,
			Name: devs[1].Name,
			DeviceRecord: DeviceRecord{
				Request: "mig", Pool: "node-a", Device: devs[1].Device, ShareID: "share-7", Kind: "mig",
				UUIDs: []string{"MIG-bbbb"},
			},
		},
	}
	if diff := gocmp.Diff(want, got.Devices, cmpIgnoreAnnotations); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
	if got.Devices[1].Annotations["gpu.dra.dev/mig-gi"] != "13" {
		t.Errorf("extra annotation lost: %v", got.Devices[1].Annotations)
	}
}

var cmpIgnoreAnnotations = gocmp.FilterPath(func(p gocmp.Path) bool {
	return p.Last().String() == ".Annotations"
}, gocmp.Ignore())

func TestWriteClaimSpecErrors(t *testing.T) {
	tests := map[string]struct {
		claim   ClaimInfo
		devices func(r *fakeRoot) []ClaimDevice
		wantErr string
	}{
		"empty claim UID": {
			claim:   ClaimInfo{},
			wantErr: "claim UID is empty",
		},
		"claim UID with a path": {
			claim:   ClaimInfo{UID: "a/../b"},
			wantErr: "cannot be used in CDI names",
		},
		"no devices": {
			devices: func(*fakeRoot) []ClaimDevice { return nil },
			wantErr: "no devices",
		},
		"duplicate device names": {
			devices: func(*fakeRoot) []ClaimDevice { return []ClaimDevice{testDevices()[0], testDevices()[0]} },
			wantErr: "not unique",
		},
		"invalid device name": {
			devices: func(*fakeRoot) []ClaimDevice {
				d := testDevices()[0]
				d.Name = "gpu 0"
				return []ClaimDevice{d}
			},
			wantErr: "CDI device name",
		},
		"device without nodes": {
			devices: func(*fakeRoot) []ClaimDevice {
				d := testDevices()[0]
				d.DeviceNodes = nil
				return []ClaimDevice{d}
			},
			wantErr: "no device nodes",
		},
		"missing device node": {
			devices: func(*fakeRoot) []ClaimDevice {
				d := testDevices()[0]
				d.DeviceNodes = []string{"/dev/nvidia7"}
				return []ClaimDevice{d}
			},
			wantErr: "nvidia7",
		},
		"device node is a regular file": {
			devices: func(r *fakeRoot) []ClaimDevice {
				r.file("/dev/nvidia5", 0o666, "")
				d := testDevices()[0]
				d.DeviceNodes = []string{"/dev/nvidia5"}
				return []ClaimDevice{d}
			},
			wantErr: "not a device node",
		},
		"relative mount": {
			devices: func(*fakeRoot) []ClaimDevice {
				d := testDevices()[0]
				d.Mounts = []Mount{{HostPath: "relative", ContainerPath: "/x"}}
				return []ClaimDevice{d}
			},
			wantErr: "must be absolute",
		},
		"relative char device": {
			devices: func(*fakeRoot) []ClaimDevice {
				return []ClaimDevice{{Name: "channel-1", CharDevices: []CharDevice{{Path: "dev/channel1", Major: 234, Minor: 1}}}}
			},
			wantErr: "device node dev/channel1: path must be absolute",
		},
		"char device major 0": {
			devices: func(*fakeRoot) []ClaimDevice {
				return []ClaimDevice{{Name: "channel-1", CharDevices: []CharDevice{{Path: "/dev/channel1", Minor: 1}}}}
			},
			wantErr: "major 0 is no device",
		},
		"rejected by CDI validation": {
			devices: func(*fakeRoot) []ClaimDevice {
				d := testDevices()[0]
				d.Env = []string{"NOT-AN-ASSIGNMENT"}
				return []ClaimDevice{d}
			},
			wantErr: "invalid environment variable",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r, specDir, w := setup(t)
			claim := tc.claim
			if name != "empty claim UID" && claim.UID == "" {
				claim = testClaim
			}
			devices := testDevices()
			if tc.devices != nil {
				devices = tc.devices(r)
			}
			_, err := w.WriteClaimSpec(context.Background(), claim, devices)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("WriteClaimSpec error = %v, want one containing %q", err, tc.wantErr)
			}
			// Nothing, not even a temporary file, is left behind.
			if entries, err := os.ReadDir(specDir); err == nil && len(entries) > 0 {
				t.Errorf("spec directory not empty after a failed write: %v", entries)
			} else if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
		})
	}
}

func TestWithContainerLibDirs(t *testing.T) {
	_, specDir, w := setup(t, WithContainerLibDirs("/usr/local/nvidia/lib64"))
	ids, err := w.WriteClaimSpec(context.Background(), testClaim, testDevices()[:1])
	if err != nil {
		t.Fatal(err)
	}
	spec := inject(t, specDir, ids...)
	var libMounts int
	for _, m := range spec.Mounts {
		if strings.HasPrefix(path.Base(m.Destination), "lib") {
			libMounts++
			if path.Dir(m.Destination) != "/usr/local/nvidia/lib64" {
				t.Errorf("library mounted at %s", m.Destination)
			}
		}
	}
	if libMounts == 0 {
		t.Error("no library mounts")
	}
}

func TestWithDriverRootDirs(t *testing.T) {
	r, specDir, w := setup(t, WithDriverRootDirs("/run/nvidia-sim"), WithHostDriverRoot("/host/root"))
	r.mkdir("/run/nvidia-sim")
	ids, err := w.WriteClaimSpec(context.Background(), testClaim, testDevices()[:1])
	if err != nil {
		t.Fatal(err)
	}
	spec := inject(t, specDir, ids...)
	var found bool
	for _, m := range spec.Mounts {
		if m.Destination == "/run/nvidia-sim" {
			found = true
			if m.Source != "/host/root/run/nvidia-sim" || !slices.Contains(m.Options, "ro") {
				t.Errorf("driver root directory mounted from %s with %v, want read-only from the host driver root", m.Source, m.Options)
			}
		}
	}
	if !found {
		t.Errorf("no mount of /run/nvidia-sim (root %s)", r.dir)
	}
}

// TestWithHostDriverRoot: a plugin container that sees a host-installed driver
// ("/") at another path reads the files there but names host paths in the
// spec, with the device numbers of the files it read.
func TestWithHostDriverRoot(t *testing.T) {
	for name, host := range map[string]string{"host-installed driver": "/", "driver container root": "/run/nvidia/driver"} {
		t.Run(name, func(t *testing.T) {
			r, specDir, w := setup(t, WithHostDriverRoot(host))
			ids, err := w.WriteClaimSpec(context.Background(), testClaim, testDevices())
			if err != nil {
				t.Fatal(err)
			}
			spec := inject(t, specDir, ids...)
			assertDevices(t, spec, "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
				"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl")
			var driverMounts int
			for _, m := range spec.Mounts {
				if m.Destination == "/run/mps" {
					continue // a device mount, not a driver file
				}
				driverMounts++
				if strings.HasPrefix(m.Source, r.dir) || !strings.HasPrefix(m.Source, path.Join(host, "usr")+"/") && !strings.HasPrefix(m.Source, path.Join(host, "opt")+"/") {
					t.Errorf("mount %s from %s, want a source below the host driver root %s", m.Destination, m.Source, host)
				}
			}
			if driverMounts == 0 {
				t.Error("no driver file mounts")
			}
			raw, err := os.ReadFile(filepath.Join(specDir, "k8s.gpu.dra.dev-gpu_"+string(testClaimUID)+".json"))
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(raw), r.dir) {
				t.Errorf("the spec names the plugin's view of the driver root %s:\n%s", r.dir, raw)
			}
			// Device nodes name their host files: hostPath is left out when it
			// equals the container path.
			var parsed cdispec.Spec
			if err := json.Unmarshal(raw, &parsed); err != nil {
				t.Fatal(err)
			}
			var nodes int
			for _, d := range parsed.Devices {
				for _, n := range d.ContainerEdits.DeviceNodes {
					nodes++
					want := path.Join(host, n.Path)
					if got := cmp.Or(n.HostPath, n.Path); got != want {
						t.Errorf("device node %s has host path %s, want %s", n.Path, got, want)
					}
				}
			}
			if nodes == 0 {
				t.Error("no device nodes in the spec")
			}
		})
	}
}

func assertDevices(t *testing.T, spec *oci.Spec, paths ...string) {
	t.Helper()
	var got []string
	for _, d := range spec.Linux.Devices {
		got = append(got, d.Path)
		if d.Type != "c" || d.Major != 1 || d.Minor != 3 {
			t.Errorf("device %s = %s %d:%d, want c 1:3", d.Path, d.Type, d.Major, d.Minor)
		}
	}
	slices.Sort(got)
	if diff := gocmp.Diff(paths, got); diff != "" {
		t.Errorf("device nodes (-want +got):\n%s", diff)
	}
	// Every node is allowed in the device cgroup.
	var allowed int
	for _, r := range spec.Linux.Resources.Devices {
		if r.Allow && r.Type == "c" && *r.Major == 1 && *r.Minor == 3 && r.Access == "rwm" {
			allowed++
		}
	}
	if allowed != len(paths) {
		t.Errorf("%d device cgroup rules, want %d", allowed, len(paths))
	}
}

func assertEnv(t *testing.T, spec *oci.Spec, want ...string) {
	t.Helper()
	got := slices.Clone(spec.Process.Env)
	slices.Sort(got)
	want = slices.Clone(want)
	slices.Sort(want)
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}
}
