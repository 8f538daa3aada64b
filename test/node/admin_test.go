package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
)

// adminClaim is a claim allocated with admin access to devices of the node,
// as the scheduler records it (adminAccess on the request and the results).
// The results are written here: kube-scheduler 1.37.2 does not fit an admin
// request on a device whose counters a holder consumes (kubernetes#140729),
// which is the case these tests are about.
func adminClaim(name string, devices ...string) *resourceapi.ResourceClaim {
	var results []resourceapi.DeviceRequestAllocationResult
	for _, d := range devices {
		results = append(results, result("admin", d, true))
	}
	return allocated(name, results...)
}

// result is an allocation result of this node's pool.
func result(request, device string, admin bool) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: request, Driver: driverName, Pool: nodeName, Device: device}
	if admin {
		r.AdminAccess = ptr.To(true)
	}
	return r
}

// allocated is a claim with the given results, one request per result name.
func allocated(name string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	claim := at.Claim(name)
	for _, r := range results {
		if slices.ContainsFunc(claim.Spec.Devices.Requests, func(q resourceapi.DeviceRequest) bool { return q.Name == r.Request }) {
			continue
		}
		q := at.Exactly(r.Request, driverName, 1)
		q.Exactly.AdminAccess = r.AdminAccess
		claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, q)
	}
	claim.UID = types.UID(name + "-uid")
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	return claim
}

// onGPU0 is a tenant claim on GPU 0 of the given DeviceClass.
func onGPU0(name, class string) *resourceapi.ResourceClaim {
	if class == "mig."+driverName {
		return migClaim(name, "1g.10gb")
	}
	r := at.Exactly("r", class, 1, `device.attributes["gpu.dra.dev"].minor == 0`)
	if class == "mps."+driverName {
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"compute": resource.MustParse("50"), "memory": resource.MustParse("20Gi"),
		}}
	}
	return at.Claim(name, r)
}

// gpu0State is what the node's set-up of GPU 0 is: MIG mode and instances,
// compute mode, time-slice level and MPS daemons.
func gpu0State(t *testing.T, dirs pluginrun.Dirs, cfg *nodeplugin.Config) string {
	t.Helper()
	m := simState(t, dirs)
	dev, _ := m.DeviceGetHandleByIndex(0)
	migMode, _, _ := dev.GetMigMode()
	compute, _ := dev.GetComputeMode()
	var insts []string
	for _, gi := range m.GpuInstances(0) {
		insts = append(insts, fmt.Sprintf("%s@%d", gi.Profile, gi.Start))
	}
	daemons, _ := filepath.Glob(filepath.Join(cfg.MPSDir, "*", "*", "nvidia-cuda-mps-control.pid"))
	return fmt.Sprintf("mig=%d instances=%v compute=%d timeslice=%d mpsDaemons=%d", migMode, insts, compute, m.Timeslice(0), len(daemons))
}

// An admin-access claim is prepared beside the claim that holds the
// device, in either order: it conflicts with nothing, gets the device
// through CDI, changes nothing on the GPU (MIG, compute mode, time-slice,
// MPS), and either can be unprepared first without touching the other.
// The prepared state survives a plugin restart (the checkpoint keeps the
// flag).
func TestAdminBeside(t *testing.T) {
	// Short names: MPS needs a short directory for its sockets.
	cases := []struct {
		name, class string
		// admin names the admin claim's device given the tenant's.
		admin func(tenantDevice string) string
		// adminLast: the admin device exists only while the tenant holds
		// it (a dynamic MIG device), so it cannot come first.
		adminLast bool
	}{
		{name: "gpu", class: driverName, admin: same},
		{name: "mig-parent", class: "mig." + driverName, admin: gpu0},
		{name: "mig", class: "mig." + driverName, admin: same, adminLast: true},
		{name: "ts", class: "timeslice." + driverName, admin: same},
		{name: "ts-parent", class: "timeslice." + driverName, admin: gpu0},
		{name: "mps", class: "mps." + driverName, admin: same},
	}
	for _, tc := range cases {
		for _, adminFirst := range []bool{false, true} {
			if adminFirst && tc.adminLast {
				continue
			}
			name := tc.name
			if adminFirst {
				name += "-a" // the admin claim is prepared first
			}
			t.Run(name, func(t *testing.T) {
				adminBesideHolder(t, tc.class, tc.admin, adminFirst)
			})
		}
	}
}

func same(device string) string { return device }
func gpu0(string) string        { return "gpu-0" }

func adminBesideHolder(t *testing.T, class string, adminDevice func(string) string, adminFirst bool) {
	ctx := context.Background()
	dirs, _, claims, _ := setupClaims(t, onGPU0("tenant", class))
	tenant := claims["tenant"]
	admin := adminClaim("admin", adminDevice(tenant.Status.Allocation.Devices.Results[0].Device))
	cfg := dirs.Config(machine, nodeName)
	if class == "mps."+driverName {
		control, err := pluginrun.BuildMPSControl(dirs.Root)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MPSControl = control
	}
	cfg.KubeClient = apiserver.NodeClient(nodeName, tenant, admin)
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	prepare := func(claim *resourceapi.ResourceClaim) []string {
		t.Helper()
		ids, err := p.Kubelet.PrepareOne(ctx, claim)
		if err != nil {
			t.Fatalf("prepare %s: %v", claim.Name, err)
		}
		return ids
	}
	unchanged := func(what, want string) {
		t.Helper()
		if got := gpu0State(t, dirs, cfg); got != want {
			t.Errorf("GPU 0 after %s: %s, want it unchanged: %s", what, got, want)
		}
	}

	var adminIDs, tenantIDs []string
	if adminFirst {
		before := gpu0State(t, dirs, cfg)
		adminIDs = prepare(admin)
		unchanged("preparing the admin claim", before)
		tenantIDs = prepare(tenant)
	} else {
		tenantIDs = prepare(tenant)
		held := gpu0State(t, dirs, cfg)
		adminIDs = prepare(admin)
		unchanged("preparing the admin claim", held)
	}
	held := gpu0State(t, dirs, cfg)

	// The admin container sees what the tenant's holds (the MIG device, or
	// its GPU), without the tenant's sharing set-up.
	tenantSpec, adminSpec := inject(t, dirs.CDI, tenantIDs), inject(t, dirs.CDI, adminIDs)
	wantUUID := simState(t, dirs).GPUUUID(0)
	if adminDevice("x") == "x" && strings.HasPrefix(class, "mig.") {
		wantUUID = env(tenantSpec, "NVIDIA_VISIBLE_DEVICES")
	}
	if got := env(adminSpec, "NVIDIA_VISIBLE_DEVICES"); got != wantUUID {
		t.Errorf("admin container: NVIDIA_VISIBLE_DEVICES=%q, want %q", got, wantUUID)
	}
	if !slices.ContainsFunc(adminSpec.Linux.Devices, func(d oci.LinuxDevice) bool { return d.Path == "/dev/nvidia0" }) {
		t.Errorf("admin container lacks /dev/nvidia0: %v", devicePaths(adminSpec))
	}
	if pipe := env(adminSpec, "CUDA_MPS_PIPE_DIRECTORY"); pipe != "" {
		t.Errorf("admin container got an MPS share (pipe %s): admin access sets no sharing up", pipe)
	}

	// A restart reloads both records as they were.
	_ = p.Stop()
	if p, err = inprocess.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	unchanged("a plugin restart", held)

	first, second, secondIDs := admin, tenant, tenantIDs
	if adminFirst {
		first, second, secondIDs = tenant, admin, adminIDs
	}
	if err := p.Kubelet.UnprepareOne(ctx, first); err != nil {
		t.Fatalf("unprepare %s: %v", first.Name, err)
	}
	if first == admin {
		unchanged("unpreparing the admin claim", held)
	}
	if again := prepare(second); !slices.Equal(again, secondIDs) {
		t.Errorf("%s after %s was unprepared: prepare returned %v, first %v", second.Name, first.Name, again, secondIDs)
	}
	if specs := specFiles(t, dirs.CDI, second); len(specs) != 1 {
		t.Errorf("%s after %s was unprepared: CDI specs %v, want its one", second.Name, first.Name, specs)
	}
	if err := p.Kubelet.UnprepareOne(ctx, second); err != nil {
		t.Fatalf("unprepare %s: %v", second.Name, err)
	}
}

// Admin access to a dynamic MIG device that no claim holds is refused with
// a clear error: the instance does not exist, and creating it for a
// monitoring claim would take the placement from tenants.
func TestAdminAccessCreatesNoMIG(t *testing.T) {
	ctx := context.Background()
	dirs, _, claims, _ := setupClaims(t, migClaim("tenant", "1g.10gb"))
	admin := adminClaim("admin", claims["tenant"].Status.Allocation.Devices.Results[0].Device)
	cfg := dirs.Config(machine, nodeName)
	cfg.KubeClient = apiserver.NodeClient(nodeName, claims["tenant"], admin)
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	before := gpu0State(t, dirs, cfg)
	_, err = p.Kubelet.PrepareOne(ctx, admin)
	if err == nil || !strings.Contains(err.Error(), "admin access does not create one") {
		t.Errorf("admin access to a MIG device no claim holds: err = %v, want a refusal saying no instance exists", err)
	}
	if got := gpu0State(t, dirs, cfg); got != before {
		t.Errorf("GPU 0 after the refused admin claim: %s, want it unchanged: %s", got, before)
	}
}

// Admin access holds nothing, so it withdraws no device from the published
// slices, while a tenant's claim withdraws what it makes impossible.
func TestAdminAccessWithdrawsNothing(t *testing.T) {
	ctx := context.Background()
	dirs, _, claims, _ := setupClaims(t, at.Claim("tenant", at.Exactly("r", driverName, 1, `device.attributes["gpu.dra.dev"].minor == 1`)))
	admin := adminClaim("admin", "gpu-0")
	client := apiserver.NodeClient(nodeName, claims["tenant"], admin)
	cfg := dirs.Config(machine, nodeName)
	cfg.KubeClient = client
	p, err := inprocess.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Stop() }()
	// published counts the published devices of GPU minor: the GPU and
	// what is carved from it or shares it.
	published := func(minor int) int {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		gpu := fmt.Sprintf("gpu-%d", minor)
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				if d.Name == gpu || strings.HasPrefix(d.Name, gpu+"-") {
					n++
				}
			}
		}
		return n
	}
	eventually(t, 10*time.Second, "slices published", func() bool { return published(0) > 1 && published(1) > 1 })
	all := published(0)
	if _, err := p.Kubelet.PrepareOne(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Kubelet.PrepareOne(ctx, claims["tenant"]); err != nil {
		t.Fatal(err)
	}
	// The publication that withdraws the tenant's GPU 1 was made with
	// the admin claim prepared.
	eventually(t, 10*time.Second, "GPU 1's other devices withdrawn for the tenant", func() bool { return published(1) == 1 })
	if got := published(0); got != all {
		t.Errorf("GPU 0 under admin access publishes %d devices, want all %d", got, all)
	}
}

// A claim with an own device and admin access to another is handled result
// by result: its own device excludes other claims, its admin device
// excludes nothing. Both survive a lost checkpoint, rebuilt from the CDI
// specs.
func TestAdminAndOwnDeviceInOneClaim(t *testing.T) {
	ctx := context.Background()
	dirs, _, claims, start := setupClaims(t, at.Claim("tenant", at.Exactly("r", driverName, 1, `device.attributes["gpu.dra.dev"].minor == 0`)))
	tenant := claims["tenant"]
	mixed := allocated("mixed", result("own", "gpu-1", false), result("admin", "gpu-0", true))
	other := allocated("other", result("r", "gpu-1", false))
	migTenant := allocated("mig", result("r", "gpu-0-mig-1g10gb-6", false))
	p := start(mixed, other, migTenant)
	defer func() { _ = p.Stop() }()
	for _, c := range []*resourceapi.ResourceClaim{tenant, mixed} {
		if _, err := p.Kubelet.PrepareOne(ctx, c); err != nil {
			t.Fatalf("prepare %s: %v", c.Name, err)
		}
	}
	if _, err := p.Kubelet.PrepareOne(ctx, other); err == nil || !strings.Contains(err.Error(), "already prepared for claim default/mixed") {
		t.Errorf("a second claim on the mixed claim's own GPU 1: err = %v, want a conflict naming it", err)
	}

	// Lose the checkpoint: the records are rebuilt from the specs.
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	cpPath := filepath.Join(dirs.PluginData, nodeplugin.CheckpointFile)
	if err := os.Remove(cpPath); err != nil {
		t.Fatal(err)
	}
	p = start(mixed, other, migTenant)
	if _, err := p.Kubelet.PrepareOne(ctx, other); err == nil || !strings.Contains(err.Error(), "already prepared for claim default/mixed") {
		t.Errorf("after the rebuild, a second claim on GPU 1: err = %v, want a conflict naming the mixed claim", err)
	}
	// GPU 0 freed by its tenant can be carved while the admin access stays.
	if err := p.Kubelet.UnprepareOne(ctx, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Kubelet.PrepareOne(ctx, migTenant); err != nil {
		t.Errorf("a MIG device of GPU 0 beside the rebuilt admin access: %v", err)
	}
}
