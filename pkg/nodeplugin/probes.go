package nodeplugin

import (
	"context"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/client-go/kubernetes"
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

// startProbes runs the probe checks when the probes or the heartbeat use
// them: it serves them on --probe-address (a server that cannot listen is
// fatal, as the kubelet would otherwise restart the plugin for failed probes
// without a reason) and renews the heartbeat Lease while they pass.
func startProbes(ctx context.Context, cfg *Config, hw *hardware, client kubernetes.Interface, fatal context.CancelCauseFunc) error {
	if cfg.ProbeAddress == "" && cfg.HeartbeatPeriod == 0 {
		return nil
	}
	p, err := cfg.prober(hw.nvml)
	if err != nil {
		return err
	}
	if cfg.HeartbeatPeriod > 0 {
		hb, err := cfg.heartbeat(client, p)
		if err != nil {
			return err
		}
		go hb.Run(ctx)
	}
	go p.Run(ctx)
	if cfg.ProbeAddress == "" {
		return nil
	}
	go func() {
		if err := p.Serve(ctx, cfg.ProbeAddress); err != nil {
			klog.FromContext(ctx).Error(err, "Probe server", "address", cfg.ProbeAddress)
			fatal(err)
		}
	}()
	return nil
}
