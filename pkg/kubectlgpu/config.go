package kubectlgpu

import (
	"encoding/json"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/opaqueconfig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Config sources.
const (
	ConfigFromClass   = "class"
	ConfigFromClaim   = "claim"
	ConfigFromDefault = "default"
)

// Config is the driver's opaque configuration in effect for one allocated
// device, chosen the way the kubelet plugin chooses it: class configs
// before claim configs, the last one naming the request (or naming no
// request) wins.
type Config struct {
	// Source is "class", "claim" or "default" (no config applies).
	Source string `json:"source"`
	// Kind is GpuConfig or MigDeviceConfig; empty for the default.
	Kind string `json:"kind,omitempty"`
	// Strategy is the sharing strategy in effect: Exclusive, TimeSlicing
	// or MPS. A share device's class decides it when the config leaves it
	// Exclusive.
	Strategy string `json:"strategy,omitempty"`
	// Summary is the strategy with its settings, as the tables show it.
	Summary string `json:"summary"`
	// Parameters are the opaque parameters as the claim or class gives them.
	Parameters json.RawMessage `json:"parameters,omitempty"`
	// Error says why the plugin will refuse the config at prepare.
	Error string `json:"error,omitempty"`
}

// String is the summary and where it comes from, e.g.
// "TimeSlicing, interval Long (claim)".
func (c Config) String() string {
	if c.Error != "" {
		return fmt.Sprintf("invalid (%s): %s", c.Source, c.Error)
	}
	return fmt.Sprintf("%s (%s)", c.Summary, c.Source)
}

// configCache describes each distinct config once: claims made from one
// template or class carry the same parameters, and decoding dominates.
type configCache map[configKey]Config

type configKey struct {
	source  resourceapi.AllocationConfigSource
	devType vocabulary.Kind
	raw     string
}

// effectiveConfig picks the config in effect for one allocation result.
func (cache configCache) effectiveConfig(configs []resourceapi.DeviceAllocationConfiguration, driver, request string, devType vocabulary.Kind) Config {
	var chosen *resourceapi.DeviceAllocationConfiguration
	for _, source := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
		for i := range configs {
			c := &configs[i]
			if c.Source == source && c.Opaque != nil && c.Opaque.Driver == driver && vocabulary.AppliesTo(c.Requests, request) {
				chosen = c
			}
		}
	}
	key := configKey{devType: devType}
	if chosen != nil {
		key.source, key.raw = chosen.Source, string(chosen.Opaque.Parameters.Raw)
	}
	if c, ok := cache[key]; ok {
		return c
	}
	c := describeConfig(chosen, devType)
	cache[key] = c
	return c
}

func describeConfig(chosen *resourceapi.DeviceAllocationConfiguration, devType vocabulary.Kind) Config {
	if chosen == nil {
		strategy := deviceStrategy(devType)
		return Config{Source: ConfigFromDefault, Strategy: strategy, Summary: describeStrategy(strategy, nil, "")}
	}
	out := Config{Source: ConfigFromClaim}
	if raw := chosen.Opaque.Parameters.Raw; json.Valid(raw) {
		out.Parameters = json.RawMessage(raw)
	}
	if chosen.Source == resourceapi.AllocationConfigSourceClass {
		out.Source = ConfigFromClass
	}
	cfg, err := opaqueconfig.DecodeDefaultValidate(chosen.Opaque.Parameters.Raw)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.Kind = cfg.GetObjectKind().GroupVersionKind().Kind
	var strategy gpuv1beta1.SharingStrategy
	var mps *gpuv1beta1.MPSConfig
	interval := ""
	switch c := cfg.(type) {
	case *gpuv1beta1.GpuConfig:
		strategy, mps = c.Sharing.Strategy, c.Sharing.MPSConfig
		if c.Sharing.TimeSlicingConfig != nil && c.Sharing.TimeSlicingConfig.Interval != nil {
			interval = string(*c.Sharing.TimeSlicingConfig.Interval)
		}
		if devType == vocabulary.KindMIG {
			out.Error = "a GpuConfig does not apply to a MIG device, use MigDeviceConfig"
		}
	case *gpuv1beta1.MigDeviceConfig:
		strategy, mps = c.Sharing.Strategy, c.Sharing.MPSConfig
		if devType != "" && devType != vocabulary.KindMIG {
			out.Error = fmt.Sprintf("a MigDeviceConfig does not apply to a %s device, use GpuConfig", devType)
		}
	}
	if want := deviceStrategy(devType); devType.Shared() {
		// The class chose the strategy; Exclusive in a config leaves it.
		if strategy == gpuv1beta1.ExclusiveStrategy {
			strategy = gpuv1beta1.SharingStrategy(want)
		} else if string(strategy) != want {
			out.Error = fmt.Sprintf("sharing strategy %s does not apply to a %s share", strategy, devType)
		}
	} else if (devType == vocabulary.KindGPU || devType == vocabulary.KindVFIO) && strategy != gpuv1beta1.ExclusiveStrategy {
		out.Error = fmt.Sprintf("a whole GPU is allocated exclusively: sharing strategy %s is not supported for it", strategy)
	}
	out.Strategy = string(strategy)
	out.Summary = describeStrategy(out.Strategy, mps, interval)
	return out
}

// deviceStrategy is the strategy a device has without config.
func deviceStrategy(devType vocabulary.Kind) string {
	switch devType {
	case vocabulary.KindTimeSlice:
		return string(gpuv1beta1.TimeSlicingStrategy)
	case vocabulary.KindMPS:
		return string(gpuv1beta1.MPSStrategy)
	case "":
		return ""
	}
	return string(gpuv1beta1.ExclusiveStrategy)
}

func describeStrategy(strategy string, mps *gpuv1beta1.MPSConfig, interval string) string {
	var parts []string
	switch strategy {
	case "":
		return "unknown device"
	case string(gpuv1beta1.TimeSlicingStrategy):
		if interval != "" {
			parts = append(parts, "interval "+interval)
		}
	case string(gpuv1beta1.MPSStrategy):
		if mps == nil || (mps.DefaultActiveThreadPercentage == nil && mps.DefaultPinnedDeviceMemoryLimit == nil && len(mps.DefaultPerDevicePinnedMemoryLimit) == 0) {
			parts = append(parts, "limits from capacity")
		}
		if mps != nil {
			if mps.DefaultActiveThreadPercentage != nil {
				parts = append(parts, fmt.Sprintf("threads %d%%", *mps.DefaultActiveThreadPercentage))
			}
			if mps.DefaultPinnedDeviceMemoryLimit != nil {
				parts = append(parts, "pinned memory "+mps.DefaultPinnedDeviceMemoryLimit.String())
			}
			if n := len(mps.DefaultPerDevicePinnedMemoryLimit); n > 0 {
				parts = append(parts, fmt.Sprintf("%d per-device memory limits", n))
			}
			if mps.ClientPriority != nil && *mps.ClientPriority != gpuv1beta1.NormalMPSClientPriority {
				parts = append(parts, "priority "+string(*mps.ClientPriority))
			}
		}
	}
	if len(parts) == 0 {
		return strategy
	}
	return strategy + ", " + strings.Join(parts, ", ")
}
