package nvmlsim

import (
	"encoding/binary"
	"fmt"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// xidRecoveryActions is the GPU recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) the
// driver reports after an XID, after the "Resolution Bucket (Immediate Action)" of NVIDIA's Xid
// catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): RESET_GPU is a GPU
// reset, RESTART_BM a node reboot, and a pending row remap (63) asks to drain and reset.
// ASSUMED where the catalog gives a workflow rather than one action (48: reset; 74: reset).
// XIDs not listed (13, 31, 43, 45, 68, 92, 94, ...: RESTART_APP or informational) leave the
// action as it was. This table models the hardware; the driver's health policy (pkg/health) is
// deliberately not derived from it.
var xidRecoveryActions = map[uint64]nvml.DeviceGpuRecoveryAction{
	48:  nvml.GPU_RECOVERY_ACTION_GPU_RESET,       // double-bit ECC error
	63:  nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET, // row remap pending: takes effect at the next reset
	64:  nvml.GPU_RECOVERY_ACTION_GPU_RESET,       // row remapper failure
	74:  nvml.GPU_RECOVERY_ACTION_GPU_RESET,       // NVLink error
	79:  nvml.GPU_RECOVERY_ACTION_NODE_REBOOT,     // fallen off the bus: RESTART_BM
	95:  nvml.GPU_RECOVERY_ACTION_GPU_RESET,       // uncontained ECC error
	109: nvml.GPU_RECOVERY_ACTION_GPU_RESET,       // context switch timeout
	119: nvml.GPU_RECOVERY_ACTION_GPU_RESET,       // GSP RPC timeout
	120: nvml.GPU_RECOVERY_ACTION_GPU_RESET,       // GSP error
}

// XIDRecoveryAction returns the recovery action the simulated driver reports after XID xid
// (GPU_RECOVERY_ACTION_NONE for XIDs that need none).
func XIDRecoveryAction(xid uint64) nvml.DeviceGpuRecoveryAction {
	return xidRecoveryActions[xid]
}

// actionRank orders actions by what they take, so that a later, milder XID does not hide a
// pending reboot.
func actionRank(a nvml.DeviceGpuRecoveryAction) int {
	switch a {
	case nvml.GPU_RECOVERY_ACTION_NONE:
		return 0
	case nvml.GPU_RECOVERY_ACTION_DRAIN_P2P:
		return 1
	case nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:
		return 2
	case nvml.GPU_RECOVERY_ACTION_GPU_RESET:
		return 3
	default: // node reboot and anything newer
		return 4
	}
}

// raiseRecoveryActionLocked records the action XID xid asks for on g. m.mu must be held.
func (g *gpu) raiseRecoveryActionLocked(xid uint64) {
	if a := XIDRecoveryAction(xid); actionRank(a) > actionRank(g.recoveryAction) {
		g.recoveryAction = a
	}
}

// WithoutRecoveryAction makes the machine answer NOT_SUPPORTED for the GPU recovery action
// field, as drivers before it existed (and older GPUs) do.
func WithoutRecoveryAction() Option {
	return func(o *options) { o.noRecoveryAction = true }
}

// getFieldValues implements Device.GetFieldValues: the GPU recovery action; every other field
// answers NOT_SUPPORTED in its value, as NVML does for fields a GPU lacks.
func (g *gpu) getFieldValues(values []nvml.FieldValue) nvml.Return {
	g.m.mu.Lock()
	defer g.m.mu.Unlock()
	for i := range values {
		v := &values[i]
		if v.FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION || g.m.noRecoveryAction {
			v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			continue
		}
		v.NvmlReturn = uint32(nvml.SUCCESS)
		v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
		v.Value = [8]byte{}
		binary.NativeEndian.PutUint32(v.Value[:], uint32(g.recoveryAction))
	}
	return nvml.SUCCESS
}

// RecoveryAction returns the recovery action GPU gpuIndex reports (NONE for an unknown GPU).
func (m *Machine) RecoveryAction(gpuIndex int) nvml.DeviceGpuRecoveryAction {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, err := m.gpuAt(gpuIndex)
	if err != nil {
		return nvml.GPU_RECOVERY_ACTION_NONE
	}
	return g.recoveryAction
}

// resetLocked is what a GPU reset does to g's simulated health state: the volatile ECC counters
// and a pending reset are cleared, and a lost GPU answers again. A pending node reboot stays:
// a reset does not satisfy it. m.mu must be held.
func (g *gpu) resetLocked() {
	g.eccCorrected, g.eccUncorrected, g.lost = 0, 0, false
	if g.recoveryAction != nvml.GPU_RECOVERY_ACTION_NODE_REBOOT {
		g.recoveryAction = nvml.GPU_RECOVERY_ACTION_NONE
	}
}

// ResetGPU performs a GPU reset (nvidia-smi -r) on GPU gpuIndex: see resetLocked. MIG instances
// are kept, since the simulation has no processes to stop. Persisted with WithStateFile.
func (m *Machine) ResetGPU(gpuIndex int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, err := m.gpuAt(gpuIndex)
	if err != nil {
		return fmt.Errorf("reset GPU: %w", err)
	}
	old := *g
	g.resetLocked()
	return m.commitErr(func() {
		g.eccCorrected, g.eccUncorrected, g.lost, g.recoveryAction = old.eccCorrected, old.eccUncorrected, old.lost, old.recoveryAction
	})
}

// bootIDPath is where the kernel's boot ID lives, relative to a driver root written by
// WriteDriverRoot ("/" on a real node).
var bootIDPath = filepath.Join("proc", "sys", "kernel", "random", "boot_id")

// BootIDFile is the boot ID file under driver root root: root/proc/sys/kernel/random/boot_id.
func BootIDFile(root string) string { return filepath.Join(root, bootIDPath) }

// BootID returns the simulated kernel boot ID, which Reboot changes.
func (m *Machine) BootID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bootIDLocked()
}

func (m *Machine) bootIDLocked() string {
	sum := digest("nvmlsim-boot", m.seed, m.spec.name, fmt.Sprint(m.boots))
	return formatUUID(sum[:16])
}

// Reboot simulates a node reboot as far as GPU health goes: a new boot ID (written to the
// driver roots' proc/sys/kernel/random/boot_id) and every GPU reset, a pending node reboot
// included. MIG instances are kept, unlike a real reboot, so that a running plugin's claims
// stay consistent. Persisted with WithStateFile.
func (m *Machine) Reboot() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	type saved struct {
		corrected, uncorrected uint64
		lost                   bool
		action                 nvml.DeviceGpuRecoveryAction
	}
	old := make([]saved, len(m.gpus))
	for i, g := range m.gpus {
		old[i] = saved{g.eccCorrected, g.eccUncorrected, g.lost, g.recoveryAction}
		g.recoveryAction = nvml.GPU_RECOVERY_ACTION_NONE
		g.resetLocked()
	}
	m.boots++
	m.resetBinding()
	return m.commitErr(func() {
		m.boots--
		for i, g := range m.gpus {
			g.eccCorrected, g.eccUncorrected, g.lost, g.recoveryAction = old[i].corrected, old[i].uncorrected, old[i].lost, old[i].action
		}
	})
}
