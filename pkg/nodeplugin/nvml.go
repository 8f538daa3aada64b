package nodeplugin

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/loadsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/simhooks"
)

// hardware is what the plugin needs from the node: NVML and the host paths
// where the driver's files and sysfs live.
type hardware struct {
	nvml nvml.Interface
	// driverRoot is where the plugin reads the driver's files,
	// hostDriverRoot where the host (the container runtime) has them.
	driverRoot     string
	hostDriverRoot string
	sysfsRoot      string
	// cdiOptions are what the hardware adds to the CDI writer's options.
	cdiOptions []cdi.Option
	// sim is set in simulation, for tests that inspect the simulated state;
	// saveWedge with it, to hang the checkpoint saves (simhooks).
	sim       *nvmlsim.Machine
	saveWedge *simhooks.SaveWedge
}

// faultHook is the engine's FaultHook: next, and in simulation the hang
// of checkpoint saves that POST /simulate/event?hangsave=true turns on.
func (hw *hardware) faultHook(next func(string)) func(string) {
	if hw.saveWedge == nil {
		return next
	}
	return hw.saveWedge.FaultHook(next)
}

// openHardware opens the real NVML library, or, with cfg.Simulate, a
// simulated machine whose state (MIG instances, compute modes) persists in
// the plugin data directory like real hardware state persists across plugin
// restarts, and whose driver root and sysfs are generated there.
// simDir holds the simulated machine's files; empty means the plugin data dir.
func openHardware(ctx context.Context, cfg *Config, simDir string) (*hardware, error) {
	logger := klog.FromContext(ctx)
	hw := &hardware{driverRoot: cfg.DriverRoot, hostDriverRoot: cfg.HostDriverRoot, sysfsRoot: cfg.SysfsRoot}
	if cfg.Simulate == "" {
		hw.nvml = nvml.New(nvml.WithLibraryPath(cfg.NVMLLibraryPath))
	} else {
		running := simDir == "" // the plugin, not --print-slices' throw-away copy
		if running {
			// A rack's clique (gb200nvl72@rack-a/2) is no subdirectory.
			simDir = filepath.Join(cfg.PluginDataDir, "simulated-"+strings.ReplaceAll(cfg.Simulate, "/", "_"))
		}
		m, err := nvmlsim.New(cfg.Simulate,
			nvmlsim.WithSeed(cfg.NodeName),
			nvmlsim.WithStateFile(filepath.Join(simDir, "nvml-state.json")))
		if err != nil {
			return nil, fmt.Errorf("simulate %q: %w", cfg.Simulate, err)
		}
		if hw.driverRoot == "" || hw.driverRoot == "/" {
			// The plugin data dir is a host path mounted at the same path.
			hw.driverRoot = filepath.Join(simDir, "driver-root")
			hw.hostDriverRoot = hw.driverRoot
		}
		if hw.sysfsRoot == "" || hw.sysfsRoot == "/sys" {
			hw.sysfsRoot = filepath.Join(simDir, "sys")
		}
		if err := m.WriteDriverRoot(hw.driverRoot); err != nil {
			return nil, fmt.Errorf("write simulated driver root: %w", err)
		}
		if err := m.WriteSysfs(hw.sysfsRoot); err != nil {
			return nil, fmt.Errorf("write simulated sysfs: %w", err)
		}
		hw.nvml, hw.sim, hw.saveWedge = m, m, &simhooks.SaveWedge{}
		if running {
			// The plugin is the simulated driver that load programs register
			// with; containers of its devices get the socket's directory.
			// Not fatal: a test's deep temporary driver root can exceed the
			// 108 bytes of a unix socket path; the plugin works without
			// simulated processes.
			// The simulated kernel binds GPUs to vfio-pci and back
			// when the plugin writes sysfs (passthrough devices).
			if err := m.ServeSysfs(ctx, hw.sysfsRoot); err != nil {
				return nil, fmt.Errorf("simulated sysfs: %w", err)
			}
			if err := m.ServeProcesses(ctx, filepath.Join(hw.driverRoot, nvmlsim.ProcessSocket)); err != nil {
				logger.Error(err, "Simulated processes cannot register; NVML lists none")
			} else {
				hw.cdiOptions = append(hw.cdiOptions, cdi.WithDriverRootDirs("/"+loadsim.ProcessSocketDir))
			}
		}
		if cfg.SimulationHook != nil {
			cfg.SimulationHook(m)
		}
		logger.Info("Using simulated GPUs (for demos and tests only)", "machine", cfg.Simulate, "driverRoot", hw.driverRoot)
	}
	if hw.hostDriverRoot == "" {
		hw.hostDriverRoot = hw.driverRoot
	}
	if cfg.WrapNVML != nil {
		hw.nvml = cfg.WrapNVML(hw.nvml)
	}
	if ret := hw.nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("initialize NVML: %w", ret)
	}
	return hw, nil
}

func (hw *hardware) close(ctx context.Context) {
	if ret := hw.nvml.Shutdown(); ret != nvml.SUCCESS {
		klog.FromContext(ctx).Error(ret, "Shut down NVML")
	}
}
