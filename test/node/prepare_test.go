// Package node tests the kubelet plugin as the kubelet sees it: the real
// plugin on a simulated machine, driven over its unix sockets by a kubelet
// stand-in, with claims allocated by the upstream allocator.
package node

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	resourceapi "k8s.io/api/resource/v1"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const (
	driverName = vocabulary.DriverName
	nodeName   = "node-1"
	machine    = "dgxh100"
)

// setup allocates claims with the upstream allocator and starts the plugin
// with a fake clientset that holds them.
func setup(t *testing.T, requests map[string]int64) (pluginrun.Dirs, *simnode.Node, map[string]*resourceapi.ResourceClaim, func(...*resourceapi.ResourceClaim) *inprocess.Plugin) {
	t.Helper()
	var claims []*resourceapi.ResourceClaim
	for _, name := range slices.Sorted(maps.Keys(requests)) {
		claims = append(claims, at.Claim(name, at.Exactly("gpus", driverName, requests[name])))
	}
	return setupClaims(t, claims...)
}

// setupClaims is setup for claims of any kind, allocated in order.
func setupClaims(t *testing.T, unallocated ...*resourceapi.ResourceClaim) (pluginrun.Dirs, *simnode.Node, map[string]*resourceapi.ResourceClaim, func(...*resourceapi.ResourceClaim) *inprocess.Plugin) {
	t.Helper()
	return setupClaimsFor(t, driverName, unallocated...)
}

// setupClaimsFor is setupClaims with the node's slices, the DeviceClasses
// and the plugin under another driver name.
func setupClaimsFor(t *testing.T, driver string, unallocated ...*resourceapi.ResourceClaim) (pluginrun.Dirs, *simnode.Node, map[string]*resourceapi.ResourceClaim, func(...*resourceapi.ResourceClaim) *inprocess.Plugin) {
	t.Helper()
	dirs, node, claims := allocateClaims(t, driver, nil, unallocated...)
	var all []*resourceapi.ResourceClaim
	for _, u := range unallocated {
		all = append(all, claims[u.Name])
	}
	start := func(extra ...*resourceapi.ResourceClaim) *inprocess.Plugin {
		t.Helper()
		cfg := dirs.Config(machine, nodeName)
		cfg.DriverName = driver
		cfg.KubeClient = apiserver.NodeClient(nodeName, append(slices.Clone(all), extra...)...)
		p, err := inprocess.Start(context.Background(), cfg)
		if err != nil {
			t.Fatalf("start plugin: %v", err)
		}
		return p
	}
	return dirs, node, claims, start
}

// allocateClaims allocates the claims on a simulated node's devices, as the
// default policy publishes them or (policy set) as policy does.
func allocateClaims(t *testing.T, driver string, policy *devicemodel.Policy, unallocated ...*resourceapi.ResourceClaim) (pluginrun.Dirs, *simnode.Node, map[string]*resourceapi.ResourceClaim) {
	t.Helper()
	dirs, err := pluginrun.NewDirs(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	node := simnode.New(t, machine, nodeName)
	if policy != nil {
		node.Resources = devicemodel.Build(node.GPUs, devicemodel.Options{NodeName: nodeName, Policy: *policy})
	}
	c := at.NewCluster(node.Slices(driver), deviceclass.DeviceClasses(driver))
	claims := map[string]*resourceapi.ResourceClaim{}
	for _, u := range unallocated {
		claim := c.MustAllocate(t, nodeName, u)[0]
		claims[claim.Name] = claim
	}
	return dirs, node, claims
}

func TestPrepareUnprepare(t *testing.T) {
	ctx := context.Background()
	dirs, node, claims, start := setup(t, map[string]int64{"one": 1, "two": 2})
	p := start()
	defer func() { _ = p.Stop() }()

	for _, name := range []string{"one", "two"} {
		claim := claims[name]
		ids, err := p.Kubelet.PrepareOne(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		gpus := allocatedGPUs(t, node, claim)
		spec := inject(t, dirs.CDI, ids)
		var wantNodes, wantUUIDs []string
		for _, g := range gpus {
			wantNodes = append(wantNodes, g.DeviceNode())
			wantUUIDs = append(wantUUIDs, g.UUID)
		}
		for _, want := range append(wantNodes, "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools") {
			if !slices.ContainsFunc(spec.Linux.Devices, func(d oci.LinuxDevice) bool { return d.Path == want }) {
				t.Errorf("%s: container lacks device node %s; has %v", name, want, devicePaths(spec))
			}
		}
		for _, d := range spec.Linux.Devices {
			if strings.HasPrefix(d.Path, "/dev/nvidia") && d.Path[len("/dev/nvidia"):] != "" && isDigits(d.Path[len("/dev/nvidia"):]) && !slices.Contains(wantNodes, d.Path) {
				t.Errorf("%s: container got GPU %s that was not allocated to it", name, d.Path)
			}
		}
		if got := env(spec, "NVIDIA_VISIBLE_DEVICES"); !sameSet(strings.Split(got, ","), wantUUIDs) {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q, want %v", name, got, wantUUIDs)
		}
		if !slices.ContainsFunc(spec.Mounts, func(m oci.Mount) bool { return strings.HasSuffix(m.Destination, "/nvidia-smi") }) {
			t.Errorf("%s: nvidia-smi is not mounted into the container", name)
		}

		again, err := p.Kubelet.PrepareOne(ctx, claim)
		if err != nil {
			t.Fatalf("repeated prepare: %v", err)
		}
		if !slices.Equal(ids, again) {
			t.Errorf("repeated prepare returned %v, first %v", again, ids)
		}
	}

	if err := p.Kubelet.UnprepareOne(ctx, claims["one"]); err != nil {
		t.Fatal(err)
	}
	if specs := specFiles(t, dirs.CDI, claims["one"]); len(specs) != 0 {
		t.Errorf("CDI spec left after unprepare: %v", specs)
	}
	if err := p.Kubelet.UnprepareOne(ctx, claims["one"]); err != nil {
		t.Errorf("repeated unprepare: %v", err)
	}
	if specs := specFiles(t, dirs.CDI, claims["two"]); len(specs) != 1 {
		t.Errorf("unprepare of one claim touched another's spec: %v", specs)
	}
}

// A plugin container that mounts the host's driver root elsewhere (a
// host-installed driver at /driver-root) reads the driver there but names the
// host's paths in the CDI spec the runtime reads.
func TestPrepareNamesHostDriverRoot(t *testing.T) {
	ctx := context.Background()
	dirs, _, claims, _ := setup(t, map[string]int64{"one": 1})
	const hostRoot = "/host/driver"
	cfg := dirs.Config(machine, nodeName)
	cfg.DriverRoot = filepath.Join(dirs.Root, "driver-root") // the plugin's view
	cfg.HostDriverRoot = hostRoot
	cfg.KubeClient = apiserver.NodeClient(nodeName, claims["one"])
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	ids, err := p.Kubelet.PrepareOne(ctx, claims["one"])
	if err != nil {
		t.Fatal(err)
	}
	spec := inject(t, dirs.CDI, ids)
	if len(spec.Mounts) == 0 || len(spec.Linux.Devices) == 0 {
		t.Fatalf("no driver mounts or device nodes: %+v", spec)
	}
	for _, m := range spec.Mounts {
		if !strings.HasPrefix(m.Source, hostRoot+"/") {
			t.Errorf("mount %s from %s, want a host path below %s", m.Destination, m.Source, hostRoot)
		}
	}
	raw, err := os.ReadFile(specFiles(t, dirs.CDI, claims["one"])[0])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), cfg.DriverRoot) {
		t.Errorf("the CDI spec names the plugin's view of the driver root %s", cfg.DriverRoot)
	}
	for _, d := range spec.Linux.Devices {
		if !strings.Contains(string(raw), `"hostPath": "`+hostRoot+d.Path+`"`) {
			t.Errorf("device node %s does not name host file %s%s", d.Path, hostRoot, d.Path)
		}
	}
}

func TestUnprepareAfterRestart(t *testing.T) {
	ctx := context.Background()
	dirs, _, claims, start := setup(t, map[string]int64{"held": 1})
	p := start()
	ids, err := p.Kubelet.PrepareOne(ctx, claims["held"])
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}

	p = start()
	defer func() { _ = p.Stop() }()
	// A restart keeps a running pod's devices: the spec stays, prepare
	// answers from the checkpoint.
	if specs := specFiles(t, dirs.CDI, claims["held"]); len(specs) != 1 {
		t.Fatalf("spec of a prepared claim lost over a restart: %v", specs)
	}
	again, err := p.Kubelet.PrepareOne(ctx, claims["held"])
	if err != nil || !slices.Equal(ids, again) {
		t.Fatalf("prepare after restart = %v, %v; want %v", again, err, ids)
	}
	if err := p.Kubelet.UnprepareOne(ctx, claims["held"]); err != nil {
		t.Fatal(err)
	}
	if specs := specFiles(t, dirs.CDI, claims["held"]); len(specs) != 0 {
		t.Errorf("CDI spec left after unprepare: %v", specs)
	}
}

// A device is never handed to two claims, even if an allocation says so.
func TestPrepareRefusesDeviceHeldByAnotherClaim(t *testing.T) {
	ctx := context.Background()
	_, _, claims, start := setup(t, map[string]int64{"first": 1})
	first := claims["first"]
	second := first.DeepCopy()
	second.Name, second.UID = "second", "second-uid"
	p := start(second)
	defer func() { _ = p.Stop() }()
	if _, err := p.Kubelet.PrepareOne(ctx, first); err != nil {
		t.Fatal(err)
	}
	_, err := p.Kubelet.PrepareOne(ctx, second)
	if err == nil || !strings.Contains(err.Error(), "already prepared for claim default/first") {
		t.Errorf("second claim on the same GPU: err = %v, want a conflict naming the first claim", err)
	}
}

func allocatedGPUs(t *testing.T, node *simnode.Node, claim *resourceapi.ResourceClaim) []discovery.GPU {
	t.Helper()
	var out []discovery.GPU
	for _, name := range at.Devices(claim) {
		i := slices.IndexFunc(node.GPUs, func(g discovery.GPU) bool { return g.CanonicalName() == name })
		if i < 0 {
			t.Fatalf("allocated unknown device %s", name)
		}
		out = append(out, node.GPUs[i])
	}
	return out
}

// inject applies CDI devices to an empty OCI spec the way runtimes do.
func inject(t *testing.T, cdiDir string, ids []string) *oci.Spec {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache: %v", err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI spec errors: %v", errs)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatalf("inject %v (unresolved %v): %v", ids, unresolved, err)
	}
	return spec
}

func specFiles(t *testing.T, dir string, claim *resourceapi.ResourceClaim) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "*"+string(claim.UID)+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return matches
}

func env(spec *oci.Spec, key string) string {
	for _, kv := range spec.Process.Env {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v
		}
	}
	return ""
}

func devicePaths(spec *oci.Spec) []string {
	var out []string
	for _, d := range spec.Linux.Devices {
		out = append(out, d.Path)
	}
	return out
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func isDigits(s string) bool {
	return strings.Trim(s, "0123456789") == ""
}

// A corrupt checkpoint is moved aside and the prepared claims are rebuilt
// from the CDI specs; the plugin starts instead of crash-looping.
func TestCorruptCheckpointRecovery(t *testing.T) {
	ctx := context.Background()
	dirs, _, claims, start := setup(t, map[string]int64{"kept": 2})
	p := start()
	ids, err := p.Kubelet.PrepareOne(ctx, claims["kept"])
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	cpPath := filepath.Join(dirs.PluginData, nodeplugin.CheckpointFile)
	if err := os.WriteFile(cpPath, []byte(`{"version":"v1","checksum":"sha256:00","data":{"claims":{}}}`), 0o600); err != nil {
		t.Fatal(err)
	}

	p = start()
	defer func() { _ = p.Stop() }()
	moved, _ := filepath.Glob(cpPath + ".corrupt-*")
	if len(moved) != 1 {
		t.Errorf("corrupt checkpoint not quarantined: %v", moved)
	}
	again, err := p.Kubelet.PrepareOne(ctx, claims["kept"])
	if err != nil || !slices.Equal(ids, again) {
		t.Fatalf("prepare after recovery = %v, %v; want %v from the rebuilt checkpoint", again, err, ids)
	}
	if err := p.Kubelet.UnprepareOne(ctx, claims["kept"]); err != nil {
		t.Fatal(err)
	}
	if specs := specFiles(t, dirs.CDI, claims["kept"]); len(specs) != 0 {
		t.Errorf("CDI spec left after unprepare: %v", specs)
	}
}
