package nvmlsim

import (
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// injectedError makes calls of method fail with ret.
type injectedError struct {
	method    string
	gpu       int // -1: any GPU
	ret       nvml.Return
	remaining int // < 0: forever
}

// InjectError makes the next times calls of method on GPU gpuIndex (-1: any GPU) return ret;
// times < 0 means every call until ClearErrors. method is an nvml.Device method name such as
// "GetUUID", "GetMemoryInfo" or "CreateGpuInstanceWithPlacement" (a leading "Device." is
// accepted); it applies to the GPU's handle and to its MIG device handles. Methods of other
// handles are named "GpuInstance.Destroy", "ComputeInstance.Destroy", "EventSet.Wait", and
// Interface methods by their own name ("Init", "DeviceGetCount", "DeviceGetHandleByIndex" - the
// latter matches gpuIndex against the index asked for; other Interface methods only match
// gpuIndex -1). Failing calls return zero values with ret as their last result.
func (m *Machine) InjectError(method string, gpuIndex int, ret nvml.Return, times int) {
	if times == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults = append(m.faults, &injectedError{
		method:    strings.TrimPrefix(method, "Device."),
		gpu:       gpuIndex,
		ret:       ret,
		remaining: times,
	})
}

// ClearErrors removes all injected errors.
func (m *Machine) ClearErrors() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.faults = nil
}

// consumeFault reports whether a call of method on GPU gpu (-1: no GPU) fails, using up one
// injected error. m.mu must be held.
func (m *Machine) consumeFault(method string, gpu int) (nvml.Return, bool) {
	for i, f := range m.faults {
		if f.method != method || (f.gpu != -1 && f.gpu != gpu) {
			continue
		}
		if f.remaining > 0 {
			f.remaining--
			if f.remaining == 0 {
				m.faults = append(m.faults[:i:i], m.faults[i+1:]...)
			}
		}
		return f.ret, true
	}
	return nvml.SUCCESS, false
}

// SetGPULost marks GPU gpuIndex as fallen off the bus (lost = true), or restores it. While lost,
// every call on the GPU's handles, and looking it up, returns nvml.ERROR_GPU_IS_LOST. Losing a
// GPU delivers XID 79 ("GPU has fallen off the bus") to event sets registered for critical XID
// errors on it. The state is persisted with WithStateFile, like the other health state.
func (m *Machine) SetGPULost(gpuIndex int, lost bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, err := m.gpuAt(gpuIndex)
	if err != nil {
		return err
	}
	if g.lost == lost {
		return nil
	}
	if lost {
		m.deliverLocked(gpuIndex, nvml.EventTypeXidCriticalError, 79, noInstance, noInstance)
	}
	g.lost = lost
	return m.commitErr(func() { g.lost = !lost })
}

// GPULost reports whether GPU gpuIndex is marked lost.
func (m *Machine) GPULost(gpuIndex int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, err := m.gpuAt(gpuIndex)
	return err == nil && g.lost
}

// Hang makes every NVML call (on the Interface and on every handle) block until Release, as a
// wedged driver or GPU leaves the calls of a real plugin: liveness probes must notice it. Calls
// already running finish; the machine's own methods (InjectEvent, SetGPULost, ...) do not block.
// The hang lives in this process only, not in the state file: a restarted plugin is not hung.
func (m *Machine) Hang() {
	m.hangMu.Lock()
	defer m.hangMu.Unlock()
	if m.hung == nil {
		m.hung = make(chan struct{})
	}
}

// Release ends a Hang: the blocked calls go on.
func (m *Machine) Release() {
	m.hangMu.Lock()
	defer m.hangMu.Unlock()
	if m.hung != nil {
		close(m.hung)
		m.hung = nil
	}
}

// Hung reports whether NVML calls hang.
func (m *Machine) Hung() bool {
	m.hangMu.Lock()
	defer m.hangMu.Unlock()
	return m.hung != nil
}

// waitWhileHung blocks while NVML calls hang. It must be called without m.mu held.
func (m *Machine) waitWhileHung() {
	m.hangMu.Lock()
	ch := m.hung
	m.hangMu.Unlock()
	if ch != nil {
		<-ch
	}
}
