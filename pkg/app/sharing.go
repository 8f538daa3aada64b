package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

// simMPSControl is the simulated nvidia-cuda-mps-control, installed next to
// the plugin binary (cmd/mps-control-sim).
const simMPSControl = "mps-control-sim"

// sharingManagers builds the time-slicing and MPS managers. MPS is nil when
// no control program is found; the node then publishes no MPS shares.
func sharingManagers(ctx context.Context, cfg *Config, hw *hardware) (*sharing.TimeSlicingManager, *sharing.MPSManager, error) {
	modes := sharing.NewNVMLComputeModes(hw.nvml)
	var slicer sharing.TimeSlicer = &sharing.NvidiaSMITimeSlicer{Path: filepath.Join(hw.driverRoot, "usr/bin/nvidia-smi")}
	if hw.sim != nil {
		slicer = sharing.NewSimTimeSlicer(hw.sim)
	}
	ts, err := sharing.NewTimeSlicingManager(sharing.TimeSlicingOptions{
		StateDir: filepath.Join(cfg.PluginDataDir, "timeslicing"), TimeSlicer: slicer, ComputeModes: modes,
	})
	if err != nil {
		return nil, nil, err
	}

	control := mpsControl(cfg, hw)
	if control == "" {
		klog.FromContext(ctx).Info("No MPS control program found; MPS shares are not published", "simulate", cfg.Simulate)
		return ts, nil, nil
	}
	mps, err := sharing.NewMPSManager(sharing.MPSOptions{
		Dir: cfg.MPSDir, ControlBinary: control, ComputeModes: modes,
		Env: []string{"LD_LIBRARY_PATH=" + filepath.Join(hw.driverRoot, "usr/lib/x86_64-linux-gnu")},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("MPS: %w", err)
	}
	return ts, mps, nil
}

// mpsControl finds nvidia-cuda-mps-control: the flag, else the driver
// root's, else — in simulation — the simulated one beside the plugin.
func mpsControl(cfg *Config, hw *hardware) string {
	if cfg.MPSControl != "" {
		return cfg.MPSControl
	}
	if hw.sim == nil {
		path := filepath.Join(hw.driverRoot, "usr/bin/nvidia-cuda-mps-control")
		if _, err := os.Stat(path); err == nil {
			return path
		}
		return ""
	}
	if exe, err := os.Executable(); err == nil {
		path := filepath.Join(filepath.Dir(exe), simMPSControl)
		if _, err := os.Stat(path); err == nil {
			return path
		}
	}
	return ""
}
