package prepare

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// errCrash stands in for a kill at a fault point: the hook panics with it
// and crashAt catches it.
var errCrash = errors.New("simulated crash")

// crashAt runs f with the driver "killed" at the fault point point: it
// returns when the hook fires, leaving the node as a crash there would.
func crashAt(t *testing.T, point string, f func(hook func(string))) {
	t.Helper()
	defer func() {
		if r := recover(); r != errCrash {
			if r != nil {
				panic(r)
			}
			t.Fatalf("fault point %s was not reached", point)
		}
	}()
	f(func(p string) {
		if p == point {
			panic(errCrash)
		}
	})
}

// crashDuring crashes d at point while it prepares claim, or, for an
// unprepare point, while it unprepares claim prepared first; setHook
// installs the crashing hook in d's FaultHook and is called with nil after.
func crashDuring(t *testing.T, d *Engine, claim *resourceapi.ResourceClaim, point string, setHook func(func(string))) {
	t.Helper()
	unprepareStep := strings.HasPrefix(point, "unprepare:")
	if unprepareStep {
		if err := prepareOne(t, d, claim); err != nil {
			t.Fatal(err)
		}
	}
	crashAt(t, point, func(h func(string)) {
		setHook(h)
		if unprepareStep {
			_ = unprepareOne(t, d, claim)
		} else {
			_ = prepareOne(t, d, claim)
		}
	})
	setHook(nil)
}

// firstDynamicMIG returns a dynamic MIG device of GPU gpu.
func firstDynamicMIG(t *testing.T, d *Engine, gpu int) string {
	t.Helper()
	for _, p := range d.published {
		if p.Kind == vocabulary.KindMIG && p.GPU.Index == gpu && p.StaticMIG == nil {
			return p.Device.Name
		}
	}
	t.Fatalf("no dynamic MIG device on GPU %d", gpu)
	return ""
}

// A claim to roll back on a GPU that is lost at restart must not stop the
// node: New succeeds, the claim's entry stays as it was and is reported,
// the other GPUs are served, and the rollback is retried later.
func TestRecoveryIsolatesLostGPU(t *testing.T) {
	var hook func(string)
	opts, node := testOptions(t, Options{FaultHook: func(p string) {
		if hook != nil {
			hook(p)
		}
	}})
	d := startTestDriver(t, opts, node)
	stuck := allocated("stuck", []string{firstDynamicMIG(t, d, 0)})
	crashAt(t, FaultPrepareMIGCreated, func(h func(string)) {
		hook = h
		_ = prepareOne(t, d, stuck)
	})
	hook = nil
	if err := node.Machine.SetGPULost(0, true); err != nil {
		t.Fatal(err)
	}

	d = startTestDriver(t, opts, node) // fails the test if New fails
	problems := d.RecoveryProblems()
	if _, ok := problems[stuck.UID]; !ok || len(problems) != 1 {
		t.Fatalf("recovery problems = %v, want the claim on the lost GPU", problems)
	}
	got := d.PreparedClaims()
	if len(got) != 1 || got[0].UID != stuck.UID || got[0].State != checkpoint.PrepareStarted {
		t.Fatalf("checkpoint = %+v, want the stuck claim kept in PrepareStarted", got)
	}
	if err := prepareOne(t, d, allocated("healthy", []string{"gpu-1"})); err != nil {
		t.Fatalf("prepare on a healthy GPU: %v", err)
	}
	if err := unprepareOne(t, d, stuck); err == nil {
		t.Fatal("unprepare of the claim on the lost GPU succeeded, want an error")
	}

	// The GPU is back: the kubelet's retry finishes the rollback.
	if err := node.Machine.SetGPULost(0, false); err != nil {
		t.Fatal(err)
	}
	if err := unprepareOne(t, d, stuck); err != nil {
		t.Fatalf("unprepare once the GPU is back: %v", err)
	}
	if p := d.RecoveryProblems(); len(p) != 0 {
		t.Errorf("recovery problems after the retry = %v, want none", p)
	}
	if insts := node.Machine.GpuInstances(0); len(insts) != 0 {
		t.Errorf("the stuck claim's MIG instance was not destroyed: %+v", insts)
	}
}

func unprepareOne(t *testing.T, d *Engine, claim *resourceapi.ResourceClaim) error {
	t.Helper()
	obj := kubeletplugin.NamespacedObject{UID: claim.UID, NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}}
	res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{obj})
	if err != nil {
		t.Fatal(err)
	}
	return res[claim.UID]
}

// A claim whose unprepare was cut off after its CDI spec was removed, on a
// GPU lost at restart, stays UnprepareStarted for the kubelet's retry; it
// gets no spec again (a spec exists only for completed claims), although
// the recorded device nodes would allow writing one.
func TestRecoveryWritesNoSpecForUnprepare(t *testing.T) {
	var hook func(string)
	opts, node := testOptions(t, Options{FaultHook: func(p string) {
		if hook != nil {
			hook(p)
		}
	}})
	d := startTestDriver(t, opts, node)
	claim := allocated("leaving", []string{firstDynamicMIG(t, d, 0)})
	if err := prepareOne(t, d, claim); err != nil {
		t.Fatal(err)
	}
	crashAt(t, FaultUnprepareCDIGone, func(h func(string)) {
		hook = h
		_ = unprepareOne(t, d, claim)
	})
	hook = nil
	if err := node.Machine.SetGPULost(0, true); err != nil {
		t.Fatal(err)
	}

	d = startTestDriver(t, opts, node)
	got := d.PreparedClaims()
	if len(got) != 1 || got[0].State != checkpoint.UnprepareStarted {
		t.Fatalf("checkpoint = %+v, want the claim kept in UnprepareStarted", got)
	}
	specs, err := opts.CDI.ListClaimSpecs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 0 {
		t.Errorf("CDI specs after restart = %+v, want none for a claim being unprepared", specs)
	}
}
