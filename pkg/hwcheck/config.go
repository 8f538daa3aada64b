package hwcheck

import (
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Config is what one hardware check needs.
type Config struct {
	// Hardware holds the kubelet plugin's flags that say where the GPUs
	// and the driver are (nodeplugin.Config.AddHardwareFlags), which the
	// check shares: Simulate runs the check over a simulated machine instead
	// of the real NVML (the dry run `make check` does); NVMLLibraryPath,
	// DriverRoot and SysfsRoot are for real GPUs. The plugin the check runs
	// starts from it.
	Hardware nodeplugin.Config
	// CompareWith is the simulated machine each GPU is compared with;
	// empty picks the machine whose GPUs have the same product name.
	CompareWith string
	// DevicePolicyFile is the chosen device policy --print-slices runs
	// with, besides the default (everything a GPU supports).
	DevicePolicyFile string
	// NodeName names the node in slices and claims.
	NodeName string
	// OutDir receives the report and the printed slices.
	OutDir string
	// Deadline bounds the whole check: phases not done by then are
	// skipped, and the report is still written. PhaseTimeout bounds each
	// phase; HealthWatch is how long health events are watched.
	Deadline     time.Duration
	PhaseTimeout time.Duration
	HealthWatch  time.Duration
	// ExpectClean makes Run fail when the report has any finding (a
	// difference, a violation, a problem): the simulated dry run expects
	// none.
	ExpectClean bool
}

// AddFlags registers the check's flags on fs.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	c.Hardware.AddHardwareFlags(fs)
	fs.StringVar(&c.CompareWith, "compare-with", "", "Simulated machine to compare each GPU with; default: the one whose GPUs have the same product name.")
	fs.StringVar(&c.DevicePolicyFile, "device-policy", "", "Device policy file --print-slices also runs with (see docs/device-model.md); empty: only the default.")
	fs.StringVar(&c.NodeName, "node-name", "gpu-check", "Node name used in slices and claims.")
	fs.StringVar(&c.OutDir, "out", ".", "Directory for gpu-check-report.md, gpu-check-report.json and the printed slices.")
	fs.DurationVar(&c.Deadline, "deadline", 4*time.Minute, "Longest time the whole check may take; phases left then are skipped and the report is written.")
	fs.DurationVar(&c.PhaseTimeout, "phase-timeout", 60*time.Second, "Longest time one phase may take.")
	fs.DurationVar(&c.HealthWatch, "health-watch", 5*time.Second, "How long health events are watched.")
	fs.BoolVar(&c.ExpectClean, "expect-clean", false, "Exit non-zero when the report has any finding (for the simulated dry run, which must have none).")
}

// Validate reports configuration errors before anything runs.
func (c *Config) Validate() error {
	// In flag order (not a map's): both wrong names the first every time.
	for _, f := range []struct{ flag, machine string }{{"--simulate", c.Hardware.Simulate}, {"--compare-with", c.CompareWith}} {
		flag, machine := f.flag, f.machine
		if machine == "" {
			continue
		}
		if _, err := nvmlsim.New(machine); err != nil {
			return fmt.Errorf("%s=%q: unknown machine, valid: %v", flag, machine, nvmlsim.Machines())
		}
	}
	if c.OutDir == "" {
		return fmt.Errorf("--out must not be empty")
	}
	if c.NodeName == "" {
		return fmt.Errorf("--node-name must not be empty")
	}
	if c.Deadline < c.PhaseTimeout {
		return fmt.Errorf("--deadline=%v must be at least --phase-timeout=%v", c.Deadline, c.PhaseTimeout)
	}
	if c.PhaseTimeout <= 0 || c.HealthWatch <= 0 || c.HealthWatch >= c.PhaseTimeout {
		return fmt.Errorf("--phase-timeout=%v and --health-watch=%v: both must be positive, the watch shorter", c.PhaseTimeout, c.HealthWatch)
	}
	return nil
}

// pluginConfig is the kubelet plugin's configuration for this check.
func (c *Config) pluginConfig() *nodeplugin.Config {
	cfg := c.Hardware
	cfg.DriverName, cfg.NodeName = vocabulary.DriverName, c.NodeName
	return &cfg
}
