package nodeplugin

import (
	"context"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/liveness"
)

// The helper's sockets, named here so that the probes check the sockets
// the kubelet uses (the helper's defaults, made explicit).
const draSocketFile = "dra.sock"

func (c *Config) registrationSocketFile() string { return c.DriverName + "-reg.sock" }

// prober returns the probes' checks of the plugin's serving path: the DRA
// and registration sockets, and NVML (lib; nil only to validate flags).
func (c *Config) prober(lib nvml.Interface) (*liveness.Prober, error) {
	return liveness.New(liveness.Options{
		Period: c.ProbePeriod, Timeout: c.ProbeTimeout, FailureThreshold: c.LivenessFailureThreshold,
		Checks: []liveness.Check{
			liveness.DRASocket(filepath.Join(c.PluginDataDir, draSocketFile)),
			liveness.RegistrationSocket(filepath.Join(c.RegistrarDir, c.registrationSocketFile())),
			liveness.NVML(lib),
		},
	})
}

// serveProbes runs the probe checks and serves them on --probe-address
// until ctx ends; a server that cannot listen is fatal, as the kubelet
// would otherwise restart the plugin for failed probes without a reason.
func serveProbes(ctx context.Context, cfg *Config, hw *hardware, fatal context.CancelCauseFunc) error {
	p, err := cfg.prober(hw.nvml)
	if err != nil {
		return err
	}
	go p.Run(ctx)
	go func() {
		if err := p.Serve(ctx, cfg.ProbeAddress); err != nil {
			klog.FromContext(ctx).Error(err, "Probe server", "address", cfg.ProbeAddress)
			fatal(err)
		}
	}()
	return nil
}
