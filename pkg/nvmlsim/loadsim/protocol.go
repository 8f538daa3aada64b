package loadsim

// ProcessSocketDir is the directory of the simulated driver root that holds ProcessSocket; the
// plugin mounts it, read-only, at "/"+ProcessSocketDir into containers of simulated devices.
const ProcessSocketDir = "run/nvidia-sim"

// ProcessSocket is where, below a simulated driver root, simulated processes register: the
// counterpart of a CUDA program opening the driver. A process connects, sends one JSON
// Registration line and keeps the connection open while it runs; the simulated machine
// (pkg/nvmlsim) answers "ok" or "error: <reason>" on one line. Its PID is the connection's
// peer (SO_PEERCRED, in the PID namespace of the process serving the socket), so a process
// cannot register another, and it is unregistered when the connection closes, as a process
// that exits loses its CUDA contexts.
const ProcessSocket = ProcessSocketDir + "/processes.sock"

// Registration is what a simulated process declares, as one JSON line on
// ProcessSocket.
type Registration struct {
	// Devices are the UUIDs (GPU-… or MIG-…) the process runs on, as NVIDIA_VISIBLE_DEVICES
	// names them.
	Devices []string `json:"devices"`
	// SMPercent is the share of the device's SMs the process keeps busy, 0-100.
	SMPercent uint32 `json:"smPercent"`
	// MemoryBytes is the device memory the process holds on each of its devices.
	MemoryBytes uint64 `json:"memoryBytes"`
	// MPS marks an MPS client: NVML lists it among the MPS compute processes.
	MPS bool `json:"mps,omitempty"`
}
