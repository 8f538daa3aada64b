package nvmlsim

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The go-nvml mocks are structs with one XxxFunc field per method; a method whose field is nil
// panics. The helpers here work on those fields generically: they fill the ones the simulation
// does not implement, and wrap every one with a guard (NVML initialized, GPU not lost, injected
// errors) so that each implementation only deals with its own behaviour.

var returnType = reflect.TypeOf(nvml.SUCCESS)

// guard decides, before a method runs, whether the call fails outright; method is the mock's
// method name (e.g. "GetUUID").
type guard func(method string) (nvml.Return, bool)

// plainAlternatives names the plain method for go-nvml methods that return handler structs.
var plainAlternatives = map[string]string{
	"GetGpuInstanceProfileInfoV":     "GetGpuInstanceProfileInfo",
	"GetGpuInstanceProfileInfoByIdV": "GetGpuInstanceProfileInfo",
	"GetComputeInstanceProfileInfoV": "GetComputeInstanceProfileInfo",
	"GetGpuFabricInfoV":              "GetGpuFabricInfo or GetGpuFabricInfo_v4",
	"GetTemperatureV":                "GetTemperature",
	"GetNvLinkInfo":                  "GetNvLinkState and GetNvLinkVersion",
	"GetC2cModeInfoV":                "nothing: C2C is not simulated",
}

// finishMock fills the unset XxxFunc fields of the mock pointed to by mockPtr and wraps all of
// them with g. typeName names the mock in panic messages. Unset methods that return an
// nvml.Return report nvml.ERROR_NOT_SUPPORTED; the others cannot fail in their signature and
// panic with an explanation.
func finishMock(mockPtr any, typeName string, g guard) {
	v := reflect.ValueOf(mockPtr).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		field := t.Field(i)
		if !field.IsExported() || field.Type.Kind() != reflect.Func || !strings.HasSuffix(field.Name, "Func") {
			continue
		}
		method := strings.TrimSuffix(field.Name, "Func")
		fv := v.Field(i)
		if fv.IsNil() {
			fv.Set(unsupported(field.Type, typeName, method))
		}
		if g != nil {
			// Wrap a copy of the function: fv is the field itself and is about to change.
			fv.Set(guarded(reflect.ValueOf(fv.Interface()), method, g))
		}
	}
}

// lastIsReturn reports whether function type ft's last result is an nvml.Return.
func lastIsReturn(ft reflect.Type) bool {
	return ft.NumOut() > 0 && ft.Out(ft.NumOut()-1) == returnType
}

// failWith returns zero values of ft's results with every nvml.Return among them set to ret
// (SetMigMode returns an activation status and a result: both fail).
func failWith(ft reflect.Type, ret nvml.Return) []reflect.Value {
	outs := make([]reflect.Value, ft.NumOut())
	for i := range outs {
		if ft.Out(i) == returnType {
			outs[i] = reflect.ValueOf(ret)
		} else {
			outs[i] = reflect.Zero(ft.Out(i))
		}
	}
	return outs
}

func unsupported(ft reflect.Type, typeName, method string) reflect.Value {
	if lastIsReturn(ft) {
		return reflect.MakeFunc(ft, func([]reflect.Value) []reflect.Value {
			return failWith(ft, nvml.ERROR_NOT_SUPPORTED)
		})
	}
	return reflect.MakeFunc(ft, func([]reflect.Value) []reflect.Value {
		if alt, ok := plainAlternatives[method]; ok {
			panic(fmt.Sprintf("nvmlsim: %s.%s cannot be simulated: go-nvml's handler it returns calls "+
				"libnvidia-ml directly; call %s instead", typeName, method, alt))
		}
		panic(fmt.Sprintf("nvmlsim: %s.%s is not simulated", typeName, method))
	})
}

func guarded(fn reflect.Value, method string, g guard) reflect.Value {
	ft := fn.Type()
	if !lastIsReturn(ft) {
		return fn
	}
	return reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
		if ret, fail := g(method); fail {
			return failWith(ft, ret)
		}
		if ft.IsVariadic() {
			return fn.CallSlice(args)
		}
		return fn.Call(args)
	})
}

// delegateInterface sets the Interface functions that take a handle as first argument
// (DeviceGetUUID(device), GpuInstanceDestroy(gi), EventSetWait(set, timeout), ...) to call the
// handle's method, as the real library does. Fields already set are left alone.
func delegateInterface(ifacePtr any) {
	handles := []struct {
		prefix string
		typ    reflect.Type
	}{
		{"Device", reflect.TypeOf((*nvml.Device)(nil)).Elem()},
		{"GpuInstance", reflect.TypeOf((*nvml.GpuInstance)(nil)).Elem()},
		{"ComputeInstance", reflect.TypeOf((*nvml.ComputeInstance)(nil)).Elem()},
		{"EventSet", reflect.TypeOf((*nvml.EventSet)(nil)).Elem()},
	}
	v := reflect.ValueOf(ifacePtr).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		field := t.Field(i)
		fv := v.Field(i)
		if field.Type.Kind() != reflect.Func || !fv.IsNil() || !strings.HasSuffix(field.Name, "Func") {
			continue
		}
		name := strings.TrimSuffix(field.Name, "Func")
		for _, h := range handles {
			if !strings.HasPrefix(name, h.prefix) || field.Type.NumIn() == 0 || field.Type.In(0) != h.typ {
				continue
			}
			method, ok := h.typ.MethodByName(strings.TrimPrefix(name, h.prefix))
			if !ok || !sameSignature(method.Type, field.Type) {
				continue
			}
			fv.Set(delegate(field.Type, method.Name))
			break
		}
	}
}

// sameSignature reports whether method type m (without receiver, as from an interface type)
// equals function type f without f's first parameter.
func sameSignature(m, f reflect.Type) bool {
	if m.NumIn() != f.NumIn()-1 || m.NumOut() != f.NumOut() || m.IsVariadic() != f.IsVariadic() {
		return false
	}
	for i := 0; i < m.NumIn(); i++ {
		if m.In(i) != f.In(i+1) {
			return false
		}
	}
	for i := 0; i < m.NumOut(); i++ {
		if m.Out(i) != f.Out(i) {
			return false
		}
	}
	return true
}

func delegate(ft reflect.Type, method string) reflect.Value {
	return reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
		if args[0].IsNil() {
			if lastIsReturn(ft) {
				return failWith(ft, nvml.ERROR_INVALID_ARGUMENT)
			}
			panic(fmt.Sprintf("nvmlsim: %s called with a nil handle", method))
		}
		m := args[0].MethodByName(method)
		if ft.IsVariadic() {
			return m.CallSlice(args[1:])
		}
		return m.Call(args[1:])
	})
}
