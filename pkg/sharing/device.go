package sharing

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"k8s.io/klog/v2"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
)

// ErrNotSupported marks a setting the device or driver does not support: a
// compute mode or time-slice on a MIG device, a driver without
// compute-policy. The managers turn it into a warning, never a failed
// preparation. Errors of ComputeModes and TimeSlicer implementations wrap it.
var ErrNotSupported = errors.New("not supported")

// DeviceRef identifies the device a share is on.
type DeviceRef struct {
	// UUID is the device's UUID as NVML reports it: GPU-… for a whole GPU,
	// MIG-… for a MIG device.
	UUID string
	// ParentUUID is the UUID of the physical GPU of a MIG device, empty for
	// a whole GPU.
	ParentUUID string
	// Index is NVML's index of the physical GPU (of the parent of a MIG
	// device). Only the simulation's TimeSlicer uses it.
	Index int
}

// IsMIG reports whether the device is a MIG device.
func (d DeviceRef) IsMIG() bool { return d.ParentUUID != "" }

// validate rejects UUIDs that would be unsafe as a command-line argument,
// environment value or control-daemon command word.
func (d DeviceRef) validate() error {
	if d.UUID == "" {
		return errors.New("device UUID is empty")
	}
	if err := checkUUID(d.UUID); err != nil {
		return err
	}
	if d.ParentUUID != "" {
		return checkUUID(d.ParentUUID)
	}
	return nil
}

// checkUUID accepts letters, digits, '-' and '/' (old MIG UUIDs have the
// form MIG-GPU-<uuid>/<gi>/<ci>).
func checkUUID(u string) error {
	for _, r := range u {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '-' || r == '/') {
			return fmt.Errorf("device UUID %q has a character other than letters, digits, '-' and '/'", u)
		}
	}
	return nil
}

// dirName is the short, stable name of the device's state file or
// directory: the UUID's type prefix and 12 hex digits of its SHA-256. It is
// short because MPS puts unix sockets below it, and a unix socket path has at
// most 107 bytes.
func dirName(uuid string) string {
	kind, _, _ := strings.Cut(uuid, "-")
	sum := sha256.Sum256([]byte(uuid))
	return strings.ToLower(kind) + "-" + hex.EncodeToString(sum[:6])
}

// ShareRef is a share as the prepare path's checkpoint records it; Reconcile
// takes the shares that are still prepared.
type ShareRef struct {
	// Device is the device the share is on.
	Device DeviceRef
	// ID identifies the share among all shares on the node and must stay
	// the same across restarts, for example "<claim UID>/<request>/<device>"
	// plus the allocation's share ID for consumable capacity.
	ID string
}

// Result is what Acquire returns for one share. The prepare path records it
// (as JSON) in its checkpoint, so that it can rewrite a claim's CDI spec
// after a restart without calling the manager, and turns Edits into the
// cdi.ClaimDevice's Env and Mounts.
type Result struct {
	// Strategy is TimeSlicing or MPS.
	Strategy gpuv1beta1.SharingStrategy `json:"strategy"`
	// UUID is the device the share is on.
	UUID string `json:"uuid"`
	// TimeSliceLevel is, for TimeSlicing, the compute-policy time-slice
	// level in force on the GPU (0 Default to 3 Long); nil when the plugin
	// does not set one (a MIG device, or a GPU or driver without support).
	TimeSliceLevel *int `json:"timeSliceLevel,omitempty"`
	// PipeDir is, for MPS, the host path of the control daemon's pipe
	// directory.
	PipeDir string `json:"pipeDir,omitempty"`
	// MemoryLimitBytes is the device memory the share's containers are
	// limited to or granted: for MPS the pinned memory limit its clients
	// get (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT); for TimeSlicing the share's
	// memory capacity, which the caller sets. 0 when there is none.
	MemoryLimitBytes int64 `json:"memoryLimitBytes,omitempty"`
	// Edits are the container edits of the share: empty for TimeSlicing.
	Edits ContainerEdits `json:"edits,omitzero"`
	// Warnings explain settings that were not applied as asked (not
	// supported, or overridden by the device's first share). They are
	// logged as well; the caller may turn them into events. They are not
	// recorded.
	Warnings []string `json:"-"`
}

// ContainerEdits are what a share adds to the containers that use it.
type ContainerEdits struct {
	// Env are "NAME=value" variables.
	Env []string `json:"env,omitempty"`
	// Mounts are bind mounts.
	Mounts []cdi.Mount `json:"mounts,omitempty"`
}

// warnf records a warning in the result and logs it.
func (r *Result) warnf(logger klog.Logger, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.Warnings = append(r.Warnings, msg)
	logger.Info("Sharing setting not applied as asked", "reason", msg)
}
