package v1beta1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

// SharingStrategy says how a GPU or MIG device is shared.
type SharingStrategy string

const (
	// ExclusiveStrategy gives the device to one claim; the containers that
	// share that claim still share the device the way CUDA does by default.
	// It is the default.
	ExclusiveStrategy SharingStrategy = "Exclusive"
	// TimeSlicingStrategy lets several claims share the device; CUDA
	// time-slices their contexts.
	TimeSlicingStrategy SharingStrategy = "TimeSlicing"
	// MPSStrategy lets several claims share the device through an MPS
	// control daemon, which runs their kernels concurrently within limits.
	MPSStrategy SharingStrategy = "MPS"
)

// gpuSharingStrategies lists the strategies a GpuConfig supports.
var gpuSharingStrategies = []SharingStrategy{ExclusiveStrategy, TimeSlicingStrategy, MPSStrategy}

// migDeviceSharingStrategies lists the strategies a MigDeviceConfig
// supports: the same three, though TimeSlicing on a MIG device takes no
// settings (see MigDeviceSharing).
var migDeviceSharingStrategies = []SharingStrategy{ExclusiveStrategy, TimeSlicingStrategy, MPSStrategy}

// GpuSharing says how a whole GPU, or the GPU behind a share, is shared.
type GpuSharing struct {
	// Strategy is one of Exclusive, TimeSlicing or MPS. It is required
	// whenever sharing is given; leave sharing out for Exclusive.
	Strategy SharingStrategy `json:"strategy"`

	// TimeSlicingConfig tunes TimeSlicing. It may be set only when Strategy
	// is TimeSlicing; unset or empty means interval Default.
	// +optional
	TimeSlicingConfig *TimeSlicingConfig `json:"timeSlicingConfig,omitempty"`

	// MPSConfig tunes MPS. It may be set only when Strategy is MPS.
	// +optional
	MPSConfig *MPSConfig `json:"mpsConfig,omitempty"`
}

// MigDeviceSharing says how a MIG device is shared.
//
// It has no timeSlicingConfig: the time-slice length is a policy of the
// physical GPU (nvidia-smi compute-policy --set-timeslice acts on a GPU, not
// on a MIG device), so a MIG device under TimeSlicing runs with whatever
// interval its parent GPU has. The strict decoder rejects the field as
// unknown.
type MigDeviceSharing struct {
	// Strategy is one of Exclusive, TimeSlicing or MPS. It is required
	// whenever sharing is given; leave sharing out for Exclusive.
	Strategy SharingStrategy `json:"strategy"`

	// MPSConfig tunes MPS inside the MIG device. It may be set only when
	// Strategy is MPS. Percentages and memory limits are relative to the
	// MIG device, not to the whole GPU.
	// +optional
	MPSConfig *MPSConfig `json:"mpsConfig,omitempty"`
}

// TimeSliceInterval is the length of the time slice a GPU gives each CUDA
// context before it switches to the next one. The names are those of
// nvidia-smi compute-policy --set-timeslice; the driver does not document
// their lengths in time.
type TimeSliceInterval string

const (
	// DefaultTimeSlice leaves the driver's default time slice (0).
	DefaultTimeSlice TimeSliceInterval = "Default"
	// ShortTimeSlice favours latency: contexts switch often (1).
	ShortTimeSlice TimeSliceInterval = "Short"
	// MediumTimeSlice is between Short and Long (2).
	MediumTimeSlice TimeSliceInterval = "Medium"
	// LongTimeSlice favours throughput: contexts switch rarely (3).
	LongTimeSlice TimeSliceInterval = "Long"
)

// timeSliceIntervals lists the supported intervals, in the order of their
// compute-policy values.
var timeSliceIntervals = []TimeSliceInterval{DefaultTimeSlice, ShortTimeSlice, MediumTimeSlice, LongTimeSlice}

// ComputePolicyValue returns the value of
// `nvidia-smi compute-policy --set-timeslice` for the interval: 0 (Default),
// 1 (Short), 2 (Medium) or 3 (Long). It fails for any other string, so an
// unvalidated config cannot turn into a wrong setting.
func (i TimeSliceInterval) ComputePolicyValue() (int, error) {
	for v, known := range timeSliceIntervals {
		if i == known {
			return v, nil
		}
	}
	return -1, fmt.Errorf("unknown time-slice interval %q (supported: Default, Short, Medium, Long)", string(i))
}

// TimeSlicingConfig tunes time-slicing of a whole GPU.
//
// The time slice is a setting of the physical GPU, so it affects every
// process on it; when claims that share one GPU ask for different intervals
// the plugin has to pick one or refuse.
type TimeSlicingConfig struct {
	// Interval is one of Default, Short, Medium or Long. Unset means
	// Default.
	// +optional
	Interval *TimeSliceInterval `json:"interval,omitempty"`
}

// MPSClientPriority is the scheduling priority of an MPS client's work
// relative to the other clients of the same MPS server
// (CUDA_MPS_CLIENT_PRIORITY).
type MPSClientPriority string

const (
	// NormalMPSClientPriority is the MPS default (CUDA_MPS_CLIENT_PRIORITY=0).
	NormalMPSClientPriority MPSClientPriority = "Normal"
	// BelowNormalMPSClientPriority lets the clients' work yield to Normal
	// clients on the same server (CUDA_MPS_CLIENT_PRIORITY=1).
	BelowNormalMPSClientPriority MPSClientPriority = "BelowNormal"
)

// mpsClientPriorities lists the supported priorities, in the order of their
// CUDA_MPS_CLIENT_PRIORITY values.
var mpsClientPriorities = []MPSClientPriority{NormalMPSClientPriority, BelowNormalMPSClientPriority}

// EnvValue returns the value of CUDA_MPS_CLIENT_PRIORITY for the priority:
// "0" (Normal) or "1" (BelowNormal). It fails for any other string.
func (p MPSClientPriority) EnvValue() (string, error) {
	for v, known := range mpsClientPriorities {
		if p == known {
			return fmt.Sprint(v), nil
		}
	}
	return "", fmt.Errorf("unknown MPS client priority %q (supported: Normal, BelowNormal)", string(p))
}

// MPSConfig tunes the MPS control daemon the plugin runs for a shared device
// and the clients that connect to it.
//
// Every field is optional and stays unset after defaulting: when a limit is
// not given, the plugin derives it from the capacity the claim requested
// (its share of the device's multiprocessors and memory), so a claim gets
// what it asked the scheduler for. Set a field only to override that.
type MPSConfig struct {
	// DefaultActiveThreadPercentage caps the share of the device's threads
	// (streaming multiprocessors) each MPS client may use, from 1 to 100
	// percent (set_default_active_thread_percentage).
	// +optional
	DefaultActiveThreadPercentage *int `json:"defaultActiveThreadPercentage,omitempty"`

	// DefaultPinnedDeviceMemoryLimit caps the device memory each MPS client
	// may allocate, on every device of the config
	// (set_default_device_pinned_mem_limit). MPS counts in mebibytes, so
	// the limit must be a whole number of them (a multiple of 1Mi, such as
	// 1536Mi or 8Gi; 1.5Mi or 8G would have to be rounded and are refused),
	// at least 1Mi and at most 1Ti.
	// +optional
	DefaultPinnedDeviceMemoryLimit *resource.Quantity `json:"defaultPinnedDeviceMemoryLimit,omitempty"`

	// DefaultPerDevicePinnedMemoryLimit overrides
	// DefaultPinnedDeviceMemoryLimit for single devices. A key is either the
	// device's UUID as nvidia-smi -L prints it (GPU-… for a GpuConfig, MIG-…
	// for a MigDeviceConfig), or the device index 0: the CUDA ordinal
	// (the key of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) of the one MPS device a
	// claim's containers reach, which CUDA always numbers 0. Other indexes
	// could never apply and are refused. When both a UUID key and 0 match
	// the device, the UUID wins. The limits follow the rules of
	// DefaultPinnedDeviceMemoryLimit.
	// +optional
	DefaultPerDevicePinnedMemoryLimit map[string]resource.Quantity `json:"defaultPerDevicePinnedMemoryLimit,omitempty"`

	// ClientPriority is the priority of the claim's containers' work
	// relative to other claims on the same MPS server: Normal (the default)
	// or BelowNormal. It lets a latency-sensitive inference claim and a batch
	// claim share a device with the batch work yielding, which the limits
	// above cannot express. The plugin passes it to the containers as
	// CUDA_MPS_CLIENT_PRIORITY.
	// +optional
	ClientPriority *MPSClientPriority `json:"clientPriority,omitempty"`
}
