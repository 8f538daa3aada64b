package prepare

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/passthrough"
)

// vfioOptions are testOptions with a sysfs of the node's own, served by the simulated kernel, and
// passthrough over it.
func vfioOptions(t *testing.T, opts Options) (Options, *simnode.Node, passthrough.Sysfs) {
	t.Helper()
	opts, node := testOptions(t, opts)
	sys := passthrough.Sysfs{Root: t.TempDir(), Timeout: 5 * time.Second}
	if err := node.Machine.WriteSysfs(sys.Root); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := node.Machine.ServeSysfs(ctx, sys.Root); err != nil {
		t.Fatal(err)
	}
	opts.Passthrough = passthrough.Host{Sysfs: sys, NVML: node.Machine}
	return opts, node, sys
}

// vfioGPU is GPU index's passthrough device name and PCI address.
func vfioGPU(node *simnode.Node, index int) (device, bdf string) {
	g := node.GPUs[index]
	return g.CanonicalName() + "-vfio", g.PCIBusID
}

func bound(t *testing.T, sys passthrough.Sysfs, bdf string) string {
	t.Helper()
	d, err := sys.Driver(bdf)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestVFIOPrepareUnprepare(t *testing.T) {
	opts, node, sys := vfioOptions(t, Options{})
	d := startTestDriver(t, opts, node)
	device, bdf := vfioGPU(node, 2)
	claim := allocated("vm", []string{device})
	if err := prepareOne(t, d, claim); err != nil {
		t.Fatal(err)
	}
	if got := bound(t, sys, bdf); got != passthrough.DriverVFIO {
		t.Fatalf("prepared: GPU bound to %q, want vfio-pci", got)
	}
	if _, ret := node.Machine.DeviceGetHandleByUUID(node.GPUs[2].UUID); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("prepared: NVML still sees the GPU (%v)", ret)
	}
	spec := claimSpec(t, opts, claim)
	group := fmt.Sprintf("/dev/vfio/%d", node.Machine.IOMMUGroup(2))
	if !strings.Contains(spec, `"path":"`+group+`"`) || !strings.Contains(spec, `"path":"/dev/vfio/vfio"`) {
		t.Errorf("CDI spec lacks %s or /dev/vfio/vfio:\n%s", group, spec)
	}
	if strings.Contains(spec, `"path":"/dev/nvidia2"`) {
		t.Errorf("CDI spec gives the passed-through GPU's /dev/nvidia2:\n%s", spec)
	}
	if err := unprepareOne(t, d, claim); err != nil {
		t.Fatal(err)
	}
	if got := bound(t, sys, bdf); got != passthrough.DriverNVIDIA {
		t.Fatalf("unprepared: GPU bound to %q, want nvidia", got)
	}
	if _, ret := node.Machine.DeviceGetHandleByUUID(node.GPUs[2].UUID); ret != nvml.SUCCESS {
		t.Errorf("unprepared: NVML does not see the GPU (%v)", ret)
	}
}

// claimSpec reads the claim's CDI spec, compacted.
func claimSpec(t *testing.T, opts Options, claim *resourceapi.ResourceClaim) string {
	t.Helper()
	return strings.NewReplacer(" ", "", "\n", "").Replace(string(claimSpecFile(t, opts, claim)))
}

// claimSpecFile reads the claim's CDI spec file.
func claimSpecFile(t *testing.T, opts Options, claim *resourceapi.ResourceClaim) []byte {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(opts.CheckpointPath), "cdi", "*"+string(claim.UID)+"*"))
	if len(matches) != 1 {
		t.Fatalf("CDI specs of %s: %v", claim.UID, matches)
	}
	b, err := os.ReadFile(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestVFIORefusedWhileInUse(t *testing.T) {
	opts, node, sys := vfioOptions(t, Options{})
	d := startTestDriver(t, opts, node)
	device, bdf := vfioGPU(node, 1)
	unregister, err := node.Machine.RegisterProcess(777, nvmlsim.Registration{Devices: []string{node.GPUs[1].UUID}, SMPercent: 5})
	if err != nil {
		t.Fatal(err)
	}
	err = prepareOne(t, d, allocated("vm", []string{device}))
	if err == nil || !strings.Contains(err.Error(), "in use by processes 777") {
		t.Fatalf("prepare while a process uses the GPU: err = %v, want a refusal naming PID 777", err)
	}
	if got := bound(t, sys, bdf); got != passthrough.DriverNVIDIA {
		t.Errorf("refused: GPU bound to %q, want nvidia", got)
	}
	if got := d.PreparedClaims(); len(got) != 0 {
		t.Errorf("refused claim recorded: %+v", got)
	}
	unregister()
	if err := prepareOne(t, d, allocated("vm", []string{device})); err != nil {
		t.Fatalf("prepare once the process ended: %v", err)
	}

	// A device of the GPU already prepared for another claim is refused before any binding.
	other := allocated("whole", []string{node.GPUs[3].CanonicalName()})
	if err := prepareOne(t, d, other); err != nil {
		t.Fatal(err)
	}
	dev3, bdf3 := vfioGPU(node, 3)
	if err := prepareOne(t, d, allocated("vm3", []string{dev3})); err == nil || !strings.Contains(err.Error(), "already prepared for claim ns/whole") {
		t.Errorf("passthrough of a GPU prepared whole: err = %v, want a conflict", err)
	}
	if got := bound(t, sys, bdf3); got != passthrough.DriverNVIDIA {
		t.Errorf("conflicting claim moved the GPU to %q", got)
	}
}

// A kill at any step of prepare or unprepare converges at the next start: a claim whose prepare
// did not complete is rolled back (the GPU is bound to nvidia again, no override left), a
// completed one keeps its GPU on vfio-pci until unprepare.
func TestVFIOCrashConverges(t *testing.T) {
	for _, point := range []string{FaultPrepareStarted, FaultPrepareVFIOBound, FaultPrepareCDIWritten, FaultPrepareCompleted, FaultUnprepareStarted, FaultUnprepareCDIGone} {
		t.Run(point, func(t *testing.T) {
			var hook func(string)
			opts, node, sys := vfioOptions(t, Options{FaultHook: func(p string) {
				if hook != nil {
					hook(p)
				}
			}})
			d := startTestDriver(t, opts, node)
			device, bdf := vfioGPU(node, 5)
			claim := allocated("vm", []string{device})
			crashDuring(t, d, claim, point, func(h func(string)) { hook = h })

			d = startTestDriver(t, opts, node)
			prepared := d.PreparedClaims()
			if point == FaultPrepareCompleted {
				if len(prepared) != 1 || prepared[0].State != checkpoint.PrepareCompleted || bound(t, sys, bdf) != passthrough.DriverVFIO {
					t.Fatalf("after a crash once completed: claims %+v, GPU on %q; want the claim kept on vfio-pci", prepared, bound(t, sys, bdf))
				}
			}
			// The kubelet unprepares (again) what it prepared; a rolled-back claim is unknown.
			if err := unprepareOne(t, d, claim); err != nil {
				t.Fatal(err)
			}
			if got := bound(t, sys, bdf); got != passthrough.DriverNVIDIA {
				t.Fatalf("GPU bound to %q, want nvidia", got)
			}
			if b, _ := os.ReadFile(filepath.Join(sys.Root, "bus/pci/devices", bdf, "driver_override")); strings.TrimSpace(string(b)) != "" {
				t.Errorf("driver_override %q left", b)
			}
			if got := d.PreparedClaims(); len(got) != 0 {
				t.Errorf("claims left: %+v", got)
			}
		})
	}
}

// A checkpoint lost after the GPU was bound and before the claim's spec was written (nothing else
// records the binding) does not leave the GPU on vfio-pci: the intent file beside the checkpoint
// tells the next start to give it back.
func TestVFIOGivenBackWhenCheckpointLost(t *testing.T) {
	var hook func(string)
	opts, node, sys := vfioOptions(t, Options{FaultHook: func(p string) {
		if hook != nil {
			hook(p)
		}
	}})
	d := startTestDriver(t, opts, node)
	device, bdf := vfioGPU(node, 4)
	crashAt(t, FaultPrepareVFIOBound, func(h func(string)) {
		hook = h
		_ = prepareOne(t, d, allocated("vm", []string{device}))
	})
	hook = nil
	if got := bound(t, sys, bdf); got != passthrough.DriverVFIO {
		t.Fatalf("at the crash: GPU bound to %q, want vfio-pci", got)
	}
	if err := os.Remove(opts.CheckpointPath); err != nil {
		t.Fatal(err)
	}
	d = startTestDriver(t, opts, node)
	if got := bound(t, sys, bdf); got != passthrough.DriverNVIDIA {
		t.Fatalf("after a start without the checkpoint: GPU bound to %q, want nvidia", got)
	}
	if got := d.PreparedClaims(); len(got) != 0 {
		t.Errorf("claims: %+v", got)
	}
	if left, _ := filepath.Glob(filepath.Join(d.vfioIntentDir(), "*")); len(left) != 0 {
		t.Errorf("intents left: %v", left)
	}
}

// Admin access to a passthrough device is refused by name: a VFIO group has one user.
func TestVFIOAdminAccessRefused(t *testing.T) {
	opts, node, sys := vfioOptions(t, Options{})
	d := startTestDriver(t, opts, node)
	device, bdf := vfioGPU(node, 6)
	claim := allocated("admin", []string{device})
	admin := true
	claim.Status.Allocation.Devices.Results[0].AdminAccess = &admin
	err := prepareOne(t, d, claim)
	if err == nil || !strings.Contains(err.Error(), "admin access does not apply to it (ask for the GPU's whole-GPU device gpu-6)") {
		t.Fatalf("admin access to %s: err = %v, want a refusal", device, err)
	}
	if got := bound(t, sys, bdf); got != passthrough.DriverNVIDIA {
		t.Errorf("GPU bound to %q", got)
	}
}
