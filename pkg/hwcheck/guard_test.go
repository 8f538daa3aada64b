package hwcheck

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// Every mutating method of every guarded type is refused without reaching
// the wrapped NVML: the wrappers here hold nil, so a call passed through
// would panic.
func TestGuardRefusesEveryMutatingMethod(t *testing.T) {
	g := NewGuard()
	wrappers := map[reflect.Type]any{
		reflect.TypeFor[nvml.Interface]():       &guardedInterface{g: g},
		reflect.TypeFor[nvml.Device]():          &guardedDevice{g: g},
		reflect.TypeFor[nvml.GpuInstance]():     &guardedGpuInstance{g: g},
		reflect.TypeFor[nvml.ComputeInstance](): &guardedComputeInstance{g: g},
		reflect.TypeFor[nvml.EventSet]():        &guardedEventSet{g: g},
		reflect.TypeFor[nvml.Unit]():            &guardedUnit{g: g},
		reflect.TypeFor[nvml.VgpuInstance]():    &guardedVgpuInstance{g: g},
	}
	refused := 0
	for _, typ := range wrappedTypes {
		w := reflect.ValueOf(wrappers[typ])
		for i := range typ.NumMethod() {
			m := typ.Method(i)
			if !mutating(m.Name) {
				continue
			}
			before := len(g.Violations())
			out := callZero(t, w.MethodByName(m.Name), typ.Name()+"."+m.Name)
			if len(g.Violations()) != before+1 {
				t.Errorf("%s.%s: no violation recorded", typ.Name(), m.Name)
			}
			for _, v := range out {
				if ret, ok := v.Interface().(nvml.Return); ok && ret != nvml.ERROR_NO_PERMISSION {
					t.Errorf("%s.%s returned %v, want ERROR_NO_PERMISSION", typ.Name(), m.Name, ret)
				}
			}
			refused++
		}
	}
	// The setters the driver itself uses must be among them.
	for _, want := range []string{"Device.SetMigMode", "Device.SetComputeMode", "Device.CreateGpuInstanceWithPlacement",
		"GpuInstance.CreateComputeInstance", "GpuInstance.Destroy", "ComputeInstance.Destroy", "Interface.DeviceSetMigMode"} {
		found := false
		for _, v := range g.Violations() {
			found = found || v.Method == want
		}
		if !found {
			t.Errorf("%s is not refused", want)
		}
	}
	if refused < 100 {
		t.Errorf("only %d methods refused; the mutating rule lost most setters", refused)
	}
	// A read passes through: over nil it panics, which shows the test
	// above would catch a passed-through setter.
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Device.GetName over a nil device did not reach it")
			}
		}()
		_, _ = (&guardedDevice{g: g}).GetName()
	}()
}

func callZero(t *testing.T, fn reflect.Value, name string) (out []reflect.Value) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s reached the wrapped NVML: %v", name, r)
		}
	}()
	args := make([]reflect.Value, fn.Type().NumIn())
	for i := range args {
		args[i] = reflect.Zero(fn.Type().In(i))
	}
	if fn.Type().IsVariadic() {
		return fn.CallSlice(args)
	}
	return fn.Call(args)
}

func TestMutatingRule(t *testing.T) {
	for name, want := range map[string]bool{
		"SetMigMode": true, "DeviceSetComputeMode": true, "CreateGpuInstanceWithPlacement": true,
		"Destroy": true, "ResetGpuLockedClocks": true, "ClearEccErrorCounts": true,
		"GetMigMode": false, "SystemGetTopologyGpuSet": false, "EventSetCreate": false,
		"RegisterEvents": false, "EventSetFree": false, "GetGpuInstances": false,
		"GetAutoBoostedClocksEnabled": false, "Init": false, "Shutdown": false,
	} {
		if got := mutating(name); got != want {
			t.Errorf("mutating(%s) = %v, want %v", name, got, want)
		}
	}
}

// Over a simulated GPU, the driver's own MIG calls are refused and change
// nothing, including through handles the guard hands out (GPU instances
// listed through it).
func TestGuardKeepsSimulatedGPUUnchanged(t *testing.T) {
	ctx := context.Background()
	sim, err := nvmlsim.New("dgxh100")
	if err != nil {
		t.Fatal(err)
	}
	g := NewGuard()
	g.SetPhase("test")
	lib := g.Wrap(sim)
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	defer lib.Shutdown()
	raw, _ := sim.DeviceGetHandleByIndex(0)
	if _, ret := raw.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	profiles, err := mig.Profiles(raw)
	if err != nil {
		t.Fatal(err)
	}
	small := profiles[0]
	if _, err := mig.Create(ctx, raw, small.ID, small.Placements[0]); err != nil {
		t.Fatal(err)
	}

	dev, ret := lib.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, err := mig.Create(ctx, dev, small.ID, small.Placements[1]); !errors.Is(err, nvml.ERROR_NO_PERMISSION) {
		t.Errorf("mig.Create through the guard: %v, want ERROR_NO_PERMISSION", err)
	}
	insts, err := mig.Instances(dev)
	if err != nil || len(insts) != 1 {
		t.Fatalf("instances through the guard: %v %v", insts, err)
	}
	if err := mig.Destroy(ctx, dev, insts[0].GIID, insts[0].CIID); err == nil {
		t.Error("mig.Destroy through the guard succeeded")
	}
	if changed, err := mig.DisableIfUnused(ctx, dev); changed || err != nil {
		t.Errorf("DisableIfUnused with an instance left: %v %v", changed, err)
	}
	if after, err := mig.Instances(raw); err != nil || len(after) != 1 {
		t.Errorf("the simulated GPU changed behind the guard: %v %v", after, err)
	}
	if cur, _, _ := raw.GetMigMode(); cur != nvml.DEVICE_MIG_ENABLE {
		t.Error("MIG mode changed behind the guard")
	}
	if len(g.Violations()) < 2 {
		t.Errorf("violations %v, want the create and the destroy", g.Violations())
	}
	if n := g.Calls()["test"]["Device.GetMigMode"]["SUCCESS"]; n == 0 {
		t.Errorf("reads are not counted: %v", g.Calls())
	}
}
