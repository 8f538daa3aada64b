package nvmlsim

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// Option configures New.
type Option func(*options)

type options struct {
	seed      string
	stateFile string
	// noRecoveryAction: the GPU recovery action field is not supported (older drivers).
	noRecoveryAction bool
}

// WithSeed makes the machine's identity (GPU and MIG UUIDs, serial numbers, NVLink cluster UUID)
// depend on seed, typically the node name, so that simulated nodes differ from each other while
// each stays the same for a given seed, machine and GPU index.
func WithSeed(seed string) Option {
	return func(o *options) { o.seed = seed }
}

// WithStateFile keeps the machine's mutable hardware state (MIG mode, GPU and compute instances
// with their IDs and placements, compute mode, time-slice, injected health state) in a JSON file
// at path: New loads it if it exists and every mutation rewrites it atomically, so a process that
// is killed and restarted finds the hardware as it left it, as it would on real GPUs.
func WithStateFile(path string) Option {
	return func(o *options) { o.stateFile = path }
}

// nvmlInterface lets Machine embed nvml.Interface under an unexported field name.
type nvmlInterface = nvml.Interface

// Machine is a simulated NVIDIA machine. It implements nvml.Interface and is safe for concurrent
// use.
type Machine struct {
	nvmlInterface

	spec              *machineSpec
	rack              rackRef
	seed              string
	stateFile         string
	driverVersion     string
	nvmlVersion       string
	cudaDriverVersion int
	noRecoveryAction  bool

	// mu guards everything below and the state reachable from gpus. Operations are in-memory,
	// plus a small atomic file write when a state file is configured.
	mu          sync.Mutex
	initCount   int
	gpus        []*gpu
	faults      []*injectedError
	eventSets   map[*mock.EventSet]*eventSet
	driverRoots []string
	// sysfsRoots are the sysfs trees written so far (WriteSysfs), whose driver links the
	// simulated kernel keeps current (pcibind.go).
	sysfsRoots []string
	// withheldNodes, when set, names the device nodes kept out of the driver roots
	// (WithholdDeviceNodes).
	withheldNodes func(name string) bool
	// imexChannels, when above the machine's own, is how many IMEX channel
	// nodes the driver roots have (SetIMEXChannels).
	imexChannels int
	// boots counts simulated reboots; the boot ID derives from it.
	boots int
	// processes are the registered simulated processes by PID (processes.go); smSecondsEnded
	// the SM time of ended ones by device UUID, for GPM.
	processes      map[uint32]*process
	smSecondsEnded map[string]float64

	// calls counts the NVML calls answered (Calls).
	calls atomic.Uint64

	// hangMu guards hung, apart from mu: a hung call waits without holding mu.
	hangMu sync.Mutex
	// hung, while NVML calls hang (Hang), is closed by Release.
	hung chan struct{}
}

var _ nvml.Interface = (*Machine)(nil)

// New returns a simulated machine, one of Machines().
func New(machine string, opts ...Option) (*Machine, error) {
	if err := CheckMachine(machine); err != nil {
		return nil, err
	}
	base, rack, _ := parseMachineName(machine)
	spec := machines[base]
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	upstream := spec.upstream()
	m := &Machine{
		spec:              spec,
		rack:              rack,
		seed:              o.seed,
		stateFile:         o.stateFile,
		driverVersion:     upstream.DriverVersion,
		nvmlVersion:       upstream.NvmlVersion,
		cudaDriverVersion: upstream.CudaDriverVersion,
		eventSets:         map[*mock.EventSet]*eventSet{},
		noRecoveryAction:  o.noRecoveryAction,
	}
	for i := range spec.buses {
		m.gpus = append(m.gpus, m.newGPU(i))
	}
	if m.stateFile != "" {
		if err := m.loadOrCreateState(); err != nil {
			return nil, fmt.Errorf("simulated machine %s: %w", machine, err)
		}
	}
	m.nvmlInterface = m.newInterface()
	return m, nil
}

// Calls returns how many NVML calls the machine answered, on the Interface and on device
// handles: a benchmark's cost measure. An Interface call that delegates to a handle's method
// (DeviceGetUUID(d)) counts twice, as it makes two calls.
func (m *Machine) Calls() uint64 {
	return m.calls.Load()
}

// GPUCount returns the number of GPUs of the machine.
func (m *Machine) GPUCount() int {
	return len(m.gpus)
}

// Name returns the machine's name, one of Machines().
func (m *Machine) Name() string {
	return m.spec.name
}

// GPUUUID returns the UUID of GPU index, or "" if there is no such GPU.
func (m *Machine) GPUUUID(index int) string {
	if index < 0 || index >= len(m.gpus) {
		return ""
	}
	return m.gpus[index].uuid
}

// GPUIndex returns the machine index of the GPU with uuid (as GPUUUID, SetTimeslice and the other
// machine-level calls take it), or -1 if there is no such GPU. Unlike an NVML index it does not
// change while another GPU is bound to vfio-pci and absent from NVML, so simulation state that
// code under test addresses must be found by UUID through it, never by NVML index.
func (m *Machine) GPUIndex(uuid string) int {
	for i, g := range m.gpus {
		if g.uuid == uuid {
			return i
		}
	}
	return -1
}

// checkInit returns nvml.ERROR_UNINITIALIZED unless NVML is initialized. m.mu must be held.
func (m *Machine) checkInit() nvml.Return {
	if m.initCount == 0 {
		return nvml.ERROR_UNINITIALIZED
	}
	return nvml.SUCCESS
}

func (m *Machine) newInterface() *mock.Interface {
	iface := &mock.Interface{}
	iface.InitFunc = m.initNVML
	iface.InitWithFlagsFunc = func(uint32) nvml.Return { return m.initNVML() }
	iface.ShutdownFunc = func() nvml.Return {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.initCount == 0 {
			return nvml.ERROR_UNINITIALIZED
		}
		m.initCount--
		return nvml.SUCCESS
	}
	iface.ErrorStringFunc = func(r nvml.Return) string { return r.Error() }
	iface.ExtensionsFunc = func() nvml.ExtendedInterface {
		// Every symbol "exists": the simulation answers or reports ERROR_NOT_SUPPORTED.
		return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
	}
	iface.SystemGetDriverVersionFunc = func() (string, nvml.Return) {
		return m.driverVersion, m.initialized()
	}
	iface.SystemGetNVMLVersionFunc = func() (string, nvml.Return) {
		return m.nvmlVersion, m.initialized()
	}
	iface.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) {
		return m.cudaDriverVersion, m.initialized()
	}
	iface.SystemGetCudaDriverVersion_v2Func = iface.SystemGetCudaDriverVersionFunc
	iface.DeviceGetCountFunc = func() (int, nvml.Return) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.nvmlGPUs()), m.checkInit()
	}
	iface.GetExcludedDeviceCountFunc = func() (int, nvml.Return) { return 0, m.initialized() }
	iface.DeviceGetHandleByIndexFunc = m.deviceByIndex
	iface.DeviceGetHandleByUUIDFunc = m.deviceByUUID
	iface.DeviceGetHandleByPciBusIdFunc = m.deviceByPciBusID
	iface.DeviceGetHandleBySerialFunc = m.deviceBySerial
	iface.EventSetCreateFunc = m.eventSetCreate
	m.setGpmFuncs(iface)
	delegateInterface(iface)
	finishMock(iface, "Interface", m.interfaceGuard)
	return iface
}

func (m *Machine) initNVML() nvml.Return {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.initCount++
	return nvml.SUCCESS
}

func (m *Machine) initialized() nvml.Return {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.checkInit()
}

// interfaceGuard applies errors injected for Interface methods (e.g. "Init",
// "DeviceGetCount") with gpuIndex -1.
func (m *Machine) interfaceGuard(method string) (nvml.Return, bool) {
	m.calls.Add(1)
	m.waitWhileHung()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.consumeFault(method, -1)
}

// lookup runs f with m.mu held after checking that NVML is initialized.
func (m *Machine) lookup(f func() (nvml.Device, nvml.Return)) (nvml.Device, nvml.Return) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ret := m.checkInit(); ret != nvml.SUCCESS {
		return nil, ret
	}
	return f()
}

// found returns g's handle, failing like NVML for a GPU that fell off the bus or that is not
// bound to the nvidia driver.
func found(g *gpu) (nvml.Device, nvml.Return) {
	if !g.inNVML() {
		return nil, nvml.ERROR_NOT_FOUND
	}
	if g.lost {
		return nil, nvml.ERROR_GPU_IS_LOST
	}
	return g.handle, nvml.SUCCESS
}

func (m *Machine) deviceByIndex(index int) (nvml.Device, nvml.Return) {
	return m.lookup(func() (nvml.Device, nvml.Return) {
		if ret, fail := m.consumeFault("DeviceGetHandleByIndex", index); fail {
			return nil, ret
		}
		gpus := m.nvmlGPUs()
		if index < 0 || index >= len(gpus) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return found(gpus[index])
	})
}

// deviceByUUID accepts GPU and MIG UUIDs, as NVML does.
func (m *Machine) deviceByUUID(uuid string) (nvml.Device, nvml.Return) {
	return m.lookup(func() (nvml.Device, nvml.Return) {
		for _, g := range m.gpus {
			if g.uuid == uuid {
				return found(g)
			}
			for _, ci := range g.computeInstances() {
				if ci.uuid == uuid {
					if !g.inNVML() {
						return nil, nvml.ERROR_NOT_FOUND
					}
					if g.lost {
						return nil, nvml.ERROR_GPU_IS_LOST
					}
					return ci.migDevice, nvml.SUCCESS
				}
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	})
}

// deviceByPciBusID accepts NVML's "00000000:18:00.0" and the sysfs "0000:18:00.0" forms.
func (m *Machine) deviceByPciBusID(busID string) (nvml.Device, nvml.Return) {
	return m.lookup(func() (nvml.Device, nvml.Return) {
		want := strings.ToLower(busID)
		for _, g := range m.gpus {
			if want == strings.ToLower(g.busID()) || want == strings.ToLower(g.nvmlBusID()) {
				return found(g)
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	})
}

func (m *Machine) deviceBySerial(serial string) (nvml.Device, nvml.Return) {
	return m.lookup(func() (nvml.Device, nvml.Return) {
		for _, g := range m.gpus {
			if g.serial == serial {
				return found(g)
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	})
}
