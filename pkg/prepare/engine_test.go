package prepare

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
)

const testDriver = "gpu.dra.dev"

func newTestDriver(t *testing.T, hook func(string)) *Engine {
	t.Helper()
	return newTestDriverWith(t, Options{FaultHook: hook})
}

// newTestDriverWith fills in opts for a simulated DGX H100 node-1.
func newTestDriverWith(t *testing.T, opts Options) *Engine {
	t.Helper()
	opts, node := testOptions(t, opts)
	return startTestDriver(t, opts, node)
}

// testOptions fills in opts for a simulated DGX H100 node-1; a driver
// started again with them finds the node as the previous one left it.
func testOptions(t *testing.T, opts Options) (Options, *simnode.Node) {
	t.Helper()
	return testOptionsOn(t, "dgxh100", opts)
}

// testOptionsOn is testOptions for a simulated machine of the given name.
func testOptionsOn(t *testing.T, machine string, opts Options) (Options, *simnode.Node) {
	t.Helper()
	node := simnode.New(t, machine, "node-1")
	root := t.TempDir()
	driverRoot := filepath.Join(root, "driver")
	if err := node.Machine.WriteDriverRoot(driverRoot); err != nil {
		t.Fatal(err)
	}
	files, err := cdi.DiscoverDriverFiles(driverRoot)
	if err != nil {
		t.Fatal(err)
	}
	opts.DriverName, opts.PoolName, opts.MIG = testDriver, "node-1", mig.NewNode(node.Machine, driverRoot)
	opts.CDI = cdi.NewWriter(filepath.Join(root, "cdi"), driverRoot, files)
	opts.CheckpointPath = filepath.Join(root, "checkpoint.json")
	opts.Store = checkpoint.NewFileStore(opts.CheckpointPath)
	return opts, node
}

// startTestDriver starts a driver as the plugin does: New, then the
// devices of the GPUs that are still there.
func startTestDriver(t *testing.T, opts Options, node *simnode.Node) *Engine {
	t.Helper()
	ctx := t.Context()
	d, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	var gpus []discovery.GPU
	for _, g := range node.GPUs {
		if !node.Machine.GPULost(g.Index) {
			gpus = append(gpus, g)
		}
	}
	// Everything published, passthrough devices too.
	on := true
	policy := devicemodel.Policy{Default: devicemodel.GPUPolicy{Passthrough: &on}}
	published, _ := devicemodel.Model(gpus, devicemodel.Options{NodeName: "node-1", Policy: policy, OwnedMIG: d.OwnsMIG})
	d.SetDevices(ctx, published)
	return d
}

// allocated builds a claim allocated to the given devices of pool node-1.
func allocated(name string, devices []string, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name + "-uid")}}
	alloc := &resourceapi.AllocationResult{}
	for i, dev := range devices {
		alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: fmt.Sprintf("req%d", i), Driver: testDriver, Pool: "node-1", Device: dev,
		})
	}
	alloc.Devices.Config = configs
	claim.Status.Allocation = alloc
	return claim
}

func opaque(source resourceapi.AllocationConfigSource, driver, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source: source, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

func prepareOne(t *testing.T, d *Engine, claim *resourceapi.ResourceClaim) error {
	t.Helper()
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatal(err)
	}
	return res[claim.UID].Err
}

const (
	exclusive   = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"Exclusive"}}`
	timeSlicing = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}`
	badField    = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"Exclusive","colour":"red"}}`
	migConfig   = `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"MigDeviceConfig"}`
)

func TestPrepareConfigs(t *testing.T) {
	class, claimSrc := resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim
	tests := map[string]struct {
		configs []resourceapi.DeviceAllocationConfiguration
		wantErr string
	}{
		"no config":                      {},
		"exclusive":                      {configs: []resourceapi.DeviceAllocationConfiguration{opaque(claimSrc, testDriver, exclusive)}},
		"claim overrides class":          {configs: []resourceapi.DeviceAllocationConfiguration{opaque(claimSrc, testDriver, exclusive), opaque(class, testDriver, timeSlicing)}},
		"class applies without override": {configs: []resourceapi.DeviceAllocationConfiguration{opaque(class, testDriver, timeSlicing)}, wantErr: `sharing strategy "TimeSlicing" is not supported`},
		"later claim config wins":        {configs: []resourceapi.DeviceAllocationConfiguration{opaque(claimSrc, testDriver, exclusive), opaque(claimSrc, testDriver, timeSlicing)}, wantErr: "TimeSlicing"},
		"other driver's config ignored":  {configs: []resourceapi.DeviceAllocationConfiguration{opaque(claimSrc, "other.example.com", `{"anything":1}`)}},
		"config for another request":     {configs: []resourceapi.DeviceAllocationConfiguration{opaque(claimSrc, testDriver, timeSlicing, "other")}},
		"config for the parent request":  {configs: []resourceapi.DeviceAllocationConfiguration{opaque(claimSrc, testDriver, timeSlicing, "req0")}, wantErr: "TimeSlicing"},
		"unknown field named":            {configs: []resourceapi.DeviceAllocationConfiguration{opaque(claimSrc, testDriver, badField)}, wantErr: "colour"},
		"wrong kind for a whole GPU":     {configs: []resourceapi.DeviceAllocationConfiguration{opaque(claimSrc, testDriver, migConfig)}, wantErr: "MigDeviceConfig does not apply"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d := newTestDriver(t, nil)
			err := prepareOne(t, d, allocated("c", []string{"gpu-0"}, tc.configs...))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
			if tc.wantErr != "" && len(d.PreparedClaims()) != 0 {
				t.Errorf("a rejected claim was recorded: %+v", d.PreparedClaims())
			}
		})
	}
}

func TestSubrequestConfigMatching(t *testing.T) {
	claim := allocated("c", []string{"gpu-0"}, opaque(resourceapi.AllocationConfigSourceClaim, testDriver, timeSlicing, "gpu"))
	claim.Status.Allocation.Devices.Results[0].Request = "gpu/h100"
	err := prepareOne(t, newTestDriver(t, nil), claim)
	if err == nil || !strings.Contains(err.Error(), "TimeSlicing") {
		t.Errorf("config for request gpu must apply to subrequest gpu/h100; err = %v", err)
	}
}

// Slow work on one GPU must not hold up claims on other GPUs, while work on
// the same GPU waits.
func TestPrepareLocksPerGPU(t *testing.T) {
	blocked := make(chan struct{})
	release := make(chan struct{})
	var first atomic.Bool
	d := newTestDriver(t, func(point string) {
		if point == FaultPrepareStarted && first.CompareAndSwap(false, true) {
			close(blocked)
			<-release
		}
	})

	slowDone := make(chan error, 1)
	go func() { slowDone <- prepareOne(t, d, allocated("slow", []string{"gpu-0"})) }()
	<-blocked

	otherDone := make(chan error, 1)
	go func() { otherDone <- prepareOne(t, d, allocated("other", []string{"gpu-1"})) }()
	select {
	case err := <-otherDone:
		if err != nil {
			t.Fatalf("claim on another GPU: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("claim on another GPU waited for the slow claim")
	}

	sameDone := make(chan error, 1)
	go func() { sameDone <- prepareOne(t, d, allocated("same", []string{"gpu-0"})) }()
	select {
	case err := <-sameDone:
		t.Fatalf("claim on the busy GPU finished before the slow one: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-slowDone; err != nil {
		t.Fatal(err)
	}
	if err := <-sameDone; err == nil || !strings.Contains(err.Error(), "already prepared for claim ns/slow") {
		t.Errorf("second claim on gpu-0: err = %v, want conflict", err)
	}
}

// However the calls interleave, one GPU goes to exactly one claim.
func TestConcurrentPreparesNeverShareAGPU(t *testing.T) {
	d := newTestDriver(t, nil)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = prepareOne(t, d, allocated(fmt.Sprintf("c%d", i), []string{"gpu-3"}))
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
		}
	}
	if ok != 1 {
		t.Errorf("%d claims got gpu-3, want exactly 1 (errors: %v)", ok, errs)
	}
}

func TestPrepareRejectsForeignPoolAndUnknownDevice(t *testing.T) {
	d := newTestDriver(t, nil)
	foreign := allocated("foreign", []string{"gpu-0"})
	foreign.Status.Allocation.Devices.Results[0].Pool = "node-2"
	if err := prepareOne(t, d, foreign); err == nil || !strings.Contains(err.Error(), `pool "node-2"`) {
		t.Errorf("foreign pool: err = %v", err)
	}
	if err := prepareOne(t, d, allocated("ghost", []string{"gpu-42"})); err == nil || !strings.Contains(err.Error(), `"gpu-42" is not published`) {
		t.Errorf("unknown device: err = %v", err)
	}
	other := allocated("mixed", []string{"gpu-0"})
	other.Status.Allocation.Devices.Results = append(other.Status.Allocation.Devices.Results,
		resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: "nic.example.com", Pool: "x", Device: "eth0"})
	if err := prepareOne(t, d, other); err != nil {
		t.Errorf("another driver's device in the claim must be ignored: %v", err)
	}
}

// The MIG devices and the checkpoint store are injected; a missing one is
// refused by name, before recovery touches anything.
func TestNewRequiresMIGAndStore(t *testing.T) {
	full, _ := testOptions(t, Options{})
	noMIG, noStore := full, full
	noMIG.MIG, noStore.Store = nil, nil
	for name, tc := range map[string]struct {
		opts Options
		want string
	}{
		"no MIG":   {opts: noMIG, want: "Options.MIG is not set"},
		"no Store": {opts: noStore, want: "Options.Store is not set"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := New(t.Context(), tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
