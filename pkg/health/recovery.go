package health

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2"
)

// Action is a recovery action NVML reports pending for a GPU
// (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): while one is pending the GPU stays
// unhealthy whatever the recovery window, until the action is seen done.
// The empty Action is none.
type Action string

// The recovery actions, by what they take. They appear in taint values
// ("XID48-reset-required").
const (
	ActionDrainP2P      Action = "drain-p2p"
	ActionDrainAndReset Action = "drain-and-reset"
	ActionReset         Action = "reset"
	ActionReboot        Action = "reboot"
)

// actionOf maps NVML's value to an Action; values newer than this code are
// named by number and, like a reboot, wait for the most: NVML reporting none
// again, or a reboot.
func actionOf(v nvml.DeviceGpuRecoveryAction) Action {
	switch v {
	case nvml.GPU_RECOVERY_ACTION_NONE:
		return ""
	case nvml.GPU_RECOVERY_ACTION_GPU_RESET, nvml.GPU_RECOVERY_ACTION_BUS_RESET:
		return ActionReset
	case nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:
		return ActionDrainAndReset
	case nvml.GPU_RECOVERY_ACTION_DRAIN_P2P:
		return ActionDrainP2P
	case nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT:
		return ActionReboot
	}
	return Action(fmt.Sprintf("recovery-action-%d", v))
}

// rank orders actions by what they take, so that a milder one reported
// later does not replace a pending reboot.
func (a Action) rank() int {
	switch a {
	case "":
		return 0
	case ActionDrainP2P:
		return 1
	case ActionDrainAndReset:
		return 2
	case ActionReset:
		return 3
	}
	return 4
}

// needsReboot: only a new boot ends the action (a GPU reset does not).
func (a Action) needsReboot() bool { return a.rank() == 4 && a != "" }

// describe says what the action asks for, for messages.
func (a Action) describe() string {
	switch a {
	case ActionReset:
		return "a GPU reset"
	case ActionDrainAndReset:
		return "draining its work and a GPU reset"
	case ActionDrainP2P:
		return "draining peer-to-peer traffic"
	case ActionReboot:
		return "a node reboot"
	}
	return "recovery action " + string(a)
}

// readRecoveryAction reads GPU dev's pending recovery action. supported is
// false when the driver or GPU does not have the field (NOT_SUPPORTED
// overall or in the value).
func readRecoveryAction(dev nvml.Device) (a Action, supported bool, ret nvml.Return) {
	values := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	ret = dev.GetFieldValues(values)
	if ret == nvml.SUCCESS {
		ret = nvml.Return(values[0].NvmlReturn)
	}
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED:
		return "", false, ret
	default:
		return "", true, ret
	}
	v := values[0]
	var n uint64
	switch nvml.ValueType(v.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		n = uint64(binary.NativeEndian.Uint32(v.Value[:]))
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		n = binary.NativeEndian.Uint64(v.Value[:])
	default:
		return "", true, nvml.ERROR_UNKNOWN
	}
	return actionOf(nvml.DeviceGpuRecoveryAction(n)), true, nvml.SUCCESS
}

// recoveryAction reads GPU uuid's pending action through NVML. ok is false
// when it is not known (lost, not supported: then the XID table and the
// recovery window decide, as before the field existed). The first
// NOT_SUPPORTED of each GPU is logged.
func (m *Monitor) recoveryAction(ctx context.Context, uuid string) (Action, bool) {
	dev, ret := m.opts.NVML.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return "", false
	}
	a, supported, ret := readRecoveryAction(dev)
	if !supported {
		m.mu.Lock()
		first := !m.actionUnsupported[uuid]
		m.actionUnsupported[uuid] = true
		m.mu.Unlock()
		if first {
			klog.FromContext(ctx).Info("GPU does not report its recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION); "+
				"unhealthy conditions end after the recovery window or an observed reset", "gpu", uuid, "err", ret)
		}
		return "", false
	}
	if ret != nvml.SUCCESS {
		klog.FromContext(ctx).V(2).Info("Cannot read the GPU's recovery action", "gpu", uuid, "err", ret)
		return "", false
	}
	return a, true
}

// ReasonRecoveryAction is the reason of a condition raised only because NVML
// reports a recovery action pending (no critical event was seen, e.g. it
// arose while the plugin was down).
const ReasonRecoveryAction = "RecoveryAction"

// applyAction records that NVML reports action a pending for the GPU (a
// non-empty a) at now. It reports whether anything changed.
func (s *Status) applyAction(a Action, now time.Time) bool {
	if s.Unhealthy == nil {
		raise(&s.Unhealthy, ReasonRecoveryAction, "NVML reports the GPU needs "+a.describe(), now)
		s.Unhealthy.Action = a
		return true
	}
	if a.rank() > s.Unhealthy.Action.rank() {
		s.Unhealthy.Action = a
		return true
	}
	return false
}

// readBootID reads a boot ID file; "" when it cannot be read.
func readBootID(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
