package hwcheck

import (
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Guard puts NVML behind a read-only wall: every call that would change a
// GPU (MIG mode, GPU and compute instances, compute mode, clocks, power,
// ECC, resets, …) is refused with ERROR_NO_PERMISSION and recorded as a
// violation, and the return code of every other call is counted, per
// phase, so the report can say which calls a real GPU does not support.
// The wrappers are generated (zz_generated_guard.go) from go-nvml's
// interfaces, so none can be missed.
type Guard struct {
	mu         sync.Mutex
	phase      string
	violations []Violation
	calls      map[string]map[string]map[string]int
}

// Violation is a refused call that would have changed a GPU.
type Violation struct {
	Phase  string `json:"phase"`
	Method string `json:"method"`
}

// NewGuard returns a guard; Wrap puts an NVML behind it.
func NewGuard() *Guard {
	return &Guard{calls: map[string]map[string]map[string]int{}}
}

// Wrap returns lib behind the guard. Handles it hands out (devices, GPU
// and compute instances, units, vGPU instances, event sets) are guarded
// too.
func (g *Guard) Wrap(lib nvml.Interface) nvml.Interface { return g.wrapInterface(lib) }

// SetPhase names the phase that following calls belong to.
func (g *Guard) SetPhase(phase string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.phase = phase
}

// Violations returns the refused calls, in order.
func (g *Guard) Violations() []Violation {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.violations)
}

// Calls returns, per phase, per method, how often each return code came
// back.
func (g *Guard) Calls() map[string]map[string]map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]map[string]map[string]int, len(g.calls))
	for phase, methods := range g.calls {
		out[phase] = make(map[string]map[string]int, len(methods))
		for m, rets := range methods {
			out[phase][m] = make(map[string]int, len(rets))
			for r, n := range rets {
				out[phase][m][r] = n
			}
		}
	}
	return out
}

func (g *Guard) refuse(method string) nvml.Return {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.violations = append(g.violations, Violation{Phase: g.phase, Method: method})
	g.count(method, "REFUSED")
	return nvml.ERROR_NO_PERMISSION
}

func (g *Guard) observe(method string, ret nvml.Return) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.count(method, ReturnName(ret))
}

func (g *Guard) count(method, ret string) {
	methods := g.calls[g.phase]
	if methods == nil {
		methods = map[string]map[string]int{}
		g.calls[g.phase] = methods
	}
	if methods[method] == nil {
		methods[method] = map[string]int{}
	}
	methods[method][ret]++
}

// ReturnName is NVML's name of a return code without the "nvml" prefix,
// e.g. SUCCESS, ERROR_NOT_SUPPORTED.
func ReturnName(ret nvml.Return) string {
	if name, ok := returnNames[ret]; ok {
		return name
	}
	return "RETURN_" + strings.TrimSpace(ret.Error())
}

var returnNames = map[nvml.Return]string{
	nvml.SUCCESS:                         "SUCCESS",
	nvml.ERROR_UNINITIALIZED:             "ERROR_UNINITIALIZED",
	nvml.ERROR_INVALID_ARGUMENT:          "ERROR_INVALID_ARGUMENT",
	nvml.ERROR_NOT_SUPPORTED:             "ERROR_NOT_SUPPORTED",
	nvml.ERROR_NO_PERMISSION:             "ERROR_NO_PERMISSION",
	nvml.ERROR_ALREADY_INITIALIZED:       "ERROR_ALREADY_INITIALIZED",
	nvml.ERROR_NOT_FOUND:                 "ERROR_NOT_FOUND",
	nvml.ERROR_INSUFFICIENT_SIZE:         "ERROR_INSUFFICIENT_SIZE",
	nvml.ERROR_INSUFFICIENT_POWER:        "ERROR_INSUFFICIENT_POWER",
	nvml.ERROR_DRIVER_NOT_LOADED:         "ERROR_DRIVER_NOT_LOADED",
	nvml.ERROR_TIMEOUT:                   "ERROR_TIMEOUT",
	nvml.ERROR_IRQ_ISSUE:                 "ERROR_IRQ_ISSUE",
	nvml.ERROR_LIBRARY_NOT_FOUND:         "ERROR_LIBRARY_NOT_FOUND",
	nvml.ERROR_FUNCTION_NOT_FOUND:        "ERROR_FUNCTION_NOT_FOUND",
	nvml.ERROR_CORRUPTED_INFOROM:         "ERROR_CORRUPTED_INFOROM",
	nvml.ERROR_GPU_IS_LOST:               "ERROR_GPU_IS_LOST",
	nvml.ERROR_RESET_REQUIRED:            "ERROR_RESET_REQUIRED",
	nvml.ERROR_OPERATING_SYSTEM:          "ERROR_OPERATING_SYSTEM",
	nvml.ERROR_LIB_RM_VERSION_MISMATCH:   "ERROR_LIB_RM_VERSION_MISMATCH",
	nvml.ERROR_IN_USE:                    "ERROR_IN_USE",
	nvml.ERROR_MEMORY:                    "ERROR_MEMORY",
	nvml.ERROR_NO_DATA:                   "ERROR_NO_DATA",
	nvml.ERROR_VGPU_ECC_NOT_SUPPORTED:    "ERROR_VGPU_ECC_NOT_SUPPORTED",
	nvml.ERROR_INSUFFICIENT_RESOURCES:    "ERROR_INSUFFICIENT_RESOURCES",
	nvml.ERROR_FREQ_NOT_SUPPORTED:        "ERROR_FREQ_NOT_SUPPORTED",
	nvml.ERROR_ARGUMENT_VERSION_MISMATCH: "ERROR_ARGUMENT_VERSION_MISMATCH",
	nvml.ERROR_DEPRECATED:                "ERROR_DEPRECATED",
	nvml.ERROR_NOT_READY:                 "ERROR_NOT_READY",
	nvml.ERROR_GPU_NOT_FOUND:             "ERROR_GPU_NOT_FOUND",
	nvml.ERROR_INVALID_STATE:             "ERROR_INVALID_STATE",
	nvml.ERROR_UNKNOWN:                   "ERROR_UNKNOWN",
}
