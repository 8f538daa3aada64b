package sharing

import (
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// DefaultContainerPipeDir is where a share's containers see the MPS pipe
// directory, and what CUDA_MPS_PIPE_DIRECTORY says there: MPS's own default.
const DefaultContainerPipeDir = "/tmp/nvidia-mps"

// Environment variables of the MPS control daemon and its clients.
const (
	envVisibleDevices         = "CUDA_VISIBLE_DEVICES"
	envMPSPipeDirectory       = "CUDA_MPS_PIPE_DIRECTORY"
	envMPSLogDirectory        = "CUDA_MPS_LOG_DIRECTORY"
	envMPSActiveThreadPercent = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	envMPSPinnedDeviceMemory  = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	envMPSClientPriority      = "CUDA_MPS_CLIENT_PRIORITY"
)

// ShareCapacity is what a share consumes of its device: the allocation
// result's consumed capacity.
type ShareCapacity struct {
	// ComputePercent is the share's percentage of the device's compute
	// (capacity "compute"), 1 to 100; 0 when the share has none.
	ComputePercent int
	// MemoryBytes is the share's device memory (capacity "memory"); 0 when
	// the share has none.
	MemoryBytes int64
}

// MPSShare is one share of a device under MPS.
type MPSShare struct {
	// ID identifies the share; see ShareRef.ID.
	ID string
	// Config is the share's defaulted and validated MPS config; nil when
	// none applies.
	Config *gpuv1beta1.MPSConfig
	// ConfigIndex is the device's position, from 0, among the devices the
	// config applies to in the claim's allocation, in allocation order: the
	// index keys of Config.DefaultPerDevicePinnedMemoryLimit refer to it.
	// Use -1 when it does not apply.
	ConfigIndex int
	// Capacity is what the share consumes; it gives the share's limits
	// where Config does not.
	Capacity ShareCapacity
}

// mpsSettings are the control daemon's defaults, from the config of the
// device's first share.
type mpsSettings struct {
	ActiveThreadPercentage *int   `json:"activeThreadPercentage,omitempty"`
	PinnedMemoryLimitMiB   *int64 `json:"pinnedMemoryLimitMiB,omitempty"`
}

func (s mpsSettings) equal(o mpsSettings) bool {
	return eqPtr(s.ActiveThreadPercentage, o.ActiveThreadPercentage) && eqPtr(s.PinnedMemoryLimitMiB, o.PinnedMemoryLimitMiB)
}

func eqPtr[T comparable](a, b *T) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

// String describes the settings for logs and warnings.
func (s mpsSettings) String() string {
	p, m := "unset", "unset"
	if s.ActiveThreadPercentage != nil {
		p = strconv.Itoa(*s.ActiveThreadPercentage) + "%"
	}
	if s.PinnedMemoryLimitMiB != nil {
		m = strconv.FormatInt(*s.PinnedMemoryLimitMiB, 10) + "M"
	}
	return fmt.Sprintf("default active thread percentage %s, default pinned memory limit %s", p, m)
}

// commands are the control daemon commands that apply the settings to the
// device with the given UUID.
func (s mpsSettings) commands(uuid string) []string {
	var cmds []string
	if s.ActiveThreadPercentage != nil {
		cmds = append(cmds, fmt.Sprintf("set_default_active_thread_percentage %d", *s.ActiveThreadPercentage))
	}
	if s.PinnedMemoryLimitMiB != nil {
		cmds = append(cmds, fmt.Sprintf("set_default_device_pinned_mem_limit %s %dM", uuid, *s.PinnedMemoryLimitMiB))
	}
	return cmds
}

// daemonSettings are the daemon defaults a share's config asks for. Limits
// derived from capacity are per share and go only to the share's
// containers.
func daemonSettings(dev DeviceRef, share MPSShare) (mpsSettings, error) {
	var s mpsSettings
	cfg := share.Config
	if cfg == nil {
		return s, nil
	}
	if p := cfg.DefaultActiveThreadPercentage; p != nil {
		if *p < 1 || *p > 100 {
			return s, fmt.Errorf("defaultActiveThreadPercentage %d is not between 1 and 100", *p)
		}
		s.ActiveThreadPercentage = ptrTo(*p)
	}
	if q := configPinnedLimit(cfg, dev.UUID, share.ConfigIndex); q != nil {
		mib, err := limitMiB(*q)
		if err != nil {
			return s, err
		}
		s.PinnedMemoryLimitMiB = &mib
	}
	return s, nil
}

// configPinnedLimit is the config's pinned memory limit for the device: by
// UUID, else by index, else the default; nil when there is none.
func configPinnedLimit(cfg *gpuv1beta1.MPSConfig, uuid string, index int) *resource.Quantity {
	if q, ok := cfg.DefaultPerDevicePinnedMemoryLimit[uuid]; ok {
		return &q
	}
	if index >= 0 {
		if q, ok := cfg.DefaultPerDevicePinnedMemoryLimit[strconv.Itoa(index)]; ok {
			return &q
		}
	}
	return cfg.DefaultPinnedDeviceMemoryLimit
}

// limitMiB converts a pinned memory limit to the whole megabytes (MiB) MPS
// counts in, rounding down.
func limitMiB(q resource.Quantity) (int64, error) {
	mib := q.Value() >> 20
	if mib < 1 {
		return 0, fmt.Errorf("pinned memory limit %s is less than 1Mi", q.String())
	}
	return mib, nil
}

// clientEdits are the container edits of a share: the pipe directory, the
// share's limits and its client priority. The limits come from the config
// where it has them, else from the share's capacity.
func clientEdits(dev DeviceRef, share MPSShare, hostPipeDir, containerPipeDir string) (ContainerEdits, error) {
	settings, err := daemonSettings(dev, share)
	if err != nil {
		return ContainerEdits{}, err
	}
	env := []string{envMPSPipeDirectory + "=" + containerPipeDir}
	percent := settings.ActiveThreadPercentage
	if percent == nil && share.Capacity.ComputePercent > 0 {
		percent = ptrTo(min(share.Capacity.ComputePercent, 100))
	}
	if percent != nil {
		env = append(env, fmt.Sprintf("%s=%d", envMPSActiveThreadPercent, *percent))
	}
	mib := settings.PinnedMemoryLimitMiB
	if mib == nil && share.Capacity.MemoryBytes >= 1<<20 {
		mib = ptrTo(share.Capacity.MemoryBytes >> 20)
	}
	if mib != nil {
		// The client sees exactly one device through this device's MPS
		// server (the daemon runs with CUDA_VISIBLE_DEVICES=<uuid>), so
		// the device is ordinal 0, the documented key of this variable.
		env = append(env, fmt.Sprintf("%s=0=%dM", envMPSPinnedDeviceMemory, *mib))
	}
	if cfg := share.Config; cfg != nil && cfg.ClientPriority != nil {
		v, err := cfg.ClientPriority.EnvValue()
		if err != nil {
			return ContainerEdits{}, err
		}
		env = append(env, envMPSClientPriority+"="+v)
	}
	return ContainerEdits{
		Env:    env,
		Mounts: []Mount{{HostPath: hostPipeDir, ContainerPath: containerPipeDir}},
	}, nil
}
