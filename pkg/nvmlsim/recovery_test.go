package nvmlsim

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// readRecoveryAction reads the recovery action field of GPU i as the health
// monitor does; the second result is the field's own return.
func readRecoveryAction(t *testing.T, m *Machine, i int) (nvml.DeviceGpuRecoveryAction, nvml.Return) {
	t.Helper()
	dev, ret := m.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(%d): %v", i, ret)
	}
	values := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := dev.GetFieldValues(values); ret != nvml.SUCCESS {
		t.Fatalf("GetFieldValues: %v", ret)
	}
	v := values[0]
	if nvml.Return(v.NvmlReturn) != nvml.SUCCESS {
		return 0, nvml.Return(v.NvmlReturn)
	}
	if nvml.ValueType(v.ValueType) != nvml.VALUE_TYPE_UNSIGNED_INT {
		t.Fatalf("value type %d, want unsigned int", v.ValueType)
	}
	return nvml.DeviceGpuRecoveryAction(binary.NativeEndian.Uint32(v.Value[:])), nvml.SUCCESS
}

// TestRecoveryActionPerXID: the field reports the catalog's action for each
// XID, a later milder XID does not lower it, and a reset clears it (but not a
// pending reboot).
func TestRecoveryActionPerXID(t *testing.T) {
	for name, tc := range map[string]struct {
		xids       []uint64
		want       nvml.DeviceGpuRecoveryAction
		afterReset nvml.DeviceGpuRecoveryAction
	}{
		"none":                 {nil, nvml.GPU_RECOVERY_ACTION_NONE, nvml.GPU_RECOVERY_ACTION_NONE},
		"application XIDs":     {[]uint64{13, 31, 43, 94}, nvml.GPU_RECOVERY_ACTION_NONE, nvml.GPU_RECOVERY_ACTION_NONE},
		"DBE":                  {[]uint64{48}, nvml.GPU_RECOVERY_ACTION_GPU_RESET, nvml.GPU_RECOVERY_ACTION_NONE},
		"row remap pending":    {[]uint64{63}, nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET, nvml.GPU_RECOVERY_ACTION_NONE},
		"off the bus":          {[]uint64{79}, nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, nvml.GPU_RECOVERY_ACTION_NODE_REBOOT},
		"reboot, then reset":   {[]uint64{79, 48}, nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, nvml.GPU_RECOVERY_ACTION_NODE_REBOOT},
		"drain, then reset":    {[]uint64{63, 119}, nvml.GPU_RECOVERY_ACTION_GPU_RESET, nvml.GPU_RECOVERY_ACTION_NONE},
		"reset, then harmless": {[]uint64{95, 13}, nvml.GPU_RECOVERY_ACTION_GPU_RESET, nvml.GPU_RECOVERY_ACTION_NONE},
	} {
		t.Run(name, func(t *testing.T) {
			m := started(t, "dgxh100")
			for _, x := range tc.xids {
				m.InjectEvent(3, nvml.EventTypeXidCriticalError, x)
			}
			if got, ret := readRecoveryAction(t, m, 3); ret != nvml.SUCCESS || got != tc.want {
				t.Errorf("after XIDs %v: %d (%v), want %d", tc.xids, got, ret, tc.want)
			}
			if got, _ := readRecoveryAction(t, m, 2); got != nvml.GPU_RECOVERY_ACTION_NONE {
				t.Errorf("another GPU reports %d, want none", got)
			}
			if err := m.ResetGPU(3); err != nil {
				t.Fatal(err)
			}
			if got, _ := readRecoveryAction(t, m, 3); got != tc.afterReset {
				t.Errorf("after a reset: %d, want %d", got, tc.afterReset)
			}
		})
	}
}

// TestRecoveryActionUnsupported: WithoutRecoveryAction answers NOT_SUPPORTED
// in the field, as older drivers do.
func TestRecoveryActionUnsupported(t *testing.T) {
	m := started(t, "dgxh100", WithoutRecoveryAction())
	m.InjectEvent(0, nvml.EventTypeXidCriticalError, 48)
	if _, ret := readRecoveryAction(t, m, 0); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("field return %v, want NOT_SUPPORTED", ret)
	}
}

// TestRebootAndPersistence: the recovery action and the boot ID survive a
// reload of the state file; Reboot changes the boot ID in the driver root's
// boot_id file and clears every action.
func TestRebootAndPersistence(t *testing.T) {
	dir := t.TempDir()
	state, root := filepath.Join(dir, "state.json"), filepath.Join(dir, "root")
	m := started(t, "dgxh100", WithStateFile(state))
	if err := m.WriteDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	readBoot := func() string {
		t.Helper()
		b, err := os.ReadFile(BootIDFile(root))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	boot := readBoot()
	if boot != m.BootID() || len(boot) != 36 {
		t.Fatalf("boot_id file %q, machine %q: want the same UUID", boot, m.BootID())
	}
	m.InjectEvent(1, nvml.EventTypeXidCriticalError, 79)
	m.InjectEvent(2, nvml.EventTypeXidCriticalError, 48)

	again := started(t, "dgxh100", WithStateFile(state))
	if again.BootID() != boot || again.RecoveryAction(1) != nvml.GPU_RECOVERY_ACTION_NODE_REBOOT ||
		again.RecoveryAction(2) != nvml.GPU_RECOVERY_ACTION_GPU_RESET {
		t.Errorf("reloaded: boot %q, actions %d, %d; want %q, reboot, reset", again.BootID(), again.RecoveryAction(1), again.RecoveryAction(2), boot)
	}

	if err := m.Reboot(); err != nil {
		t.Fatal(err)
	}
	if got := readBoot(); got == boot || got != m.BootID() {
		t.Errorf("boot_id after Reboot %q (before %q, machine %q): want the machine's new one", got, boot, m.BootID())
	}
	for i := range m.GPUCount() {
		if a := m.RecoveryAction(i); a != nvml.GPU_RECOVERY_ACTION_NONE {
			t.Errorf("GPU %d: recovery action %d after Reboot, want none", i, a)
		}
	}
	rebooted := started(t, "dgxh100", WithStateFile(state))
	if rebooted.BootID() != m.BootID() {
		t.Errorf("reloaded after Reboot: boot %q, want %q", rebooted.BootID(), m.BootID())
	}
}
