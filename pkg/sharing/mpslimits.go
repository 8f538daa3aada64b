package sharing

import (
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
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
	if q, name := configPinnedLimit(cfg, dev.UUID); q != nil {
		mib, err := limitMiB(*q)
		if err != nil {
			return s, fmt.Errorf("%s: %w", name, err)
		}
		s.PinnedMemoryLimitMiB = &mib
	}
	return s, nil
}

// mpsDeviceOrdinal is the CUDA ordinal of a share's device in its
// containers: they reach one MPS device (the plugin refuses claims with
// more), through a server whose daemon runs with CUDA_VISIBLE_DEVICES set
// to that device alone.
const mpsDeviceOrdinal = 0

// configPinnedLimit is the config's pinned memory limit for the device and
// the field it comes from: the device's UUID key, else the index key of
// its ordinal in the containers (0), else the default; nil when there is
// none.
func configPinnedLimit(cfg *gpuv1beta1.MPSConfig, uuid string) (*resource.Quantity, string) {
	const perDevice = "defaultPerDevicePinnedMemoryLimit"
	if q, ok := cfg.DefaultPerDevicePinnedMemoryLimit[uuid]; ok {
		return &q, perDevice + "[" + uuid + "]"
	}
	ordinal := strconv.Itoa(mpsDeviceOrdinal)
	if q, ok := cfg.DefaultPerDevicePinnedMemoryLimit[ordinal]; ok {
		return &q, perDevice + "[" + ordinal + "]"
	}
	return cfg.DefaultPinnedDeviceMemoryLimit, "defaultPinnedDeviceMemoryLimit"
}

// limitMiB converts a pinned memory limit to the mebibytes MPS counts in.
// Validate refuses limits that are not a whole number of them; so does
// this, rather than round.
func limitMiB(q resource.Quantity) (int64, error) {
	b, ok := q.AsInt64()
	if !ok {
		b = q.Value()
		if resource.NewQuantity(b, resource.BinarySI).Cmp(q) != 0 {
			b = -1 // a fraction of a byte
		}
	}
	switch {
	case b < 1<<20:
		return 0, fmt.Errorf("pinned memory limit %s is less than 1Mi", q.String())
	case b%(1<<20) != 0:
		return 0, fmt.Errorf("pinned memory limit %s is not a whole number of mebibytes, the unit MPS takes it in", q.String())
	}
	return b >> 20, nil
}

// clientPinnedLimitMiB is the pinned memory limit a share's clients get:
// the config's (settings), else the share's memory capacity; nil when
// there is neither.
func clientPinnedLimitMiB(settings mpsSettings, share MPSShare) (*int64, error) {
	if settings.PinnedMemoryLimitMiB != nil || share.Capacity.MemoryBytes <= 0 {
		return settings.PinnedMemoryLimitMiB, nil
	}
	// The capacity's request policy has a step of 1Mi, so the scheduler
	// only hands out whole mebibytes.
	m, err := limitMiB(*resource.NewQuantity(share.Capacity.MemoryBytes, resource.BinarySI))
	if err != nil {
		return nil, fmt.Errorf("consumed memory capacity: %w", err)
	}
	return &m, nil
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
	mib, err := clientPinnedLimitMiB(settings, share)
	if err != nil {
		return ContainerEdits{}, err
	}
	if mib != nil {
		// The variable is keyed by the CUDA ordinal the client sees.
		env = append(env, fmt.Sprintf("%s=%d=%dM", envMPSPinnedDeviceMemory, mpsDeviceOrdinal, *mib))
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
		Mounts: []cdi.Mount{{HostPath: hostPipeDir, ContainerPath: containerPipeDir}},
	}, nil
}
