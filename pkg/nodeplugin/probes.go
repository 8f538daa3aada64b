package nodeplugin

import (
	"cmp"
	"context"
	"path/filepath"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/liveness"
	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
)

// The helper's sockets, named here so that the probes check the sockets
// the kubelet uses. Without --pod-uid they are the helper's fixed names;
// with it (rolling upgrades) both carry the pod's UID, as the helper names
// them, so that the old and the new instance serve side by side.
func (c *Config) draSocketFile() string {
	if c.PodUID != "" {
		return "dra-" + c.PodUID + ".sock"
	}
	return "dra.sock"
}

func (c *Config) registrationSocketFile() string {
	if c.PodUID != "" {
		return kubeletplugin.RollingUpdateRegistrarSocketFile(c.RegistrarDir, c.DriverName, types.UID(c.PodUID))
	}
	return c.DriverName + "-reg.sock"
}

// socketOptions are the helper's options that name the sockets.
func (c *Config) socketOptions() []kubeletplugin.Option {
	opts := []kubeletplugin.Option{
		kubeletplugin.RegistrarDirectoryPath(c.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(c.PluginDataDir),
		kubeletplugin.PluginSocket(c.draSocketFile()),
	}
	if c.PodUID != "" {
		return append(opts, kubeletplugin.RollingUpdate(types.UID(c.PodUID)))
	}
	return append(opts, kubeletplugin.RegistrarSocketFilename(c.registrationSocketFile()))
}

// prober returns the probes' checks of the plugin's serving path: the DRA
// and registration sockets, NVML and the prepare engine. lib and engine
// return the NVML and engine in use, nil while the instance waits to own
// the node (it opens NVML only then: the simulation's state is the
// node's); their checks pass until then.
func (c *Config) prober(lib func() nvml.Interface, engine func() liveness.Stalls) (*liveness.Prober, error) {
	nvmlCheck := liveness.Check{Name: liveness.NVMLCheck, Run: func(ctx context.Context) error {
		if l := lib(); l != nil {
			return liveness.NVML(l).Run(ctx)
		}
		return nil
	}}
	return liveness.New(liveness.Options{
		Period: c.ProbePeriod, Timeout: c.ProbeTimeout, FailureThreshold: c.LivenessFailureThreshold,
		Checks: []liveness.Check{
			liveness.DRASocket(filepath.Join(c.PluginDataDir, c.draSocketFile())),
			liveness.RegistrationSocket(filepath.Join(c.RegistrarDir, c.registrationSocketFile())),
			nvmlCheck,
			liveness.Engine(engine, cmp.Or(c.EngineStallBound, liveness.DefaultStallBound)),
		},
	})
}

// startProbes runs the probe checks when the probes or the heartbeat use
// them: it serves them on --probe-address (a server that cannot listen is
// fatal, as the kubelet would otherwise restart the plugin for failed probes
// without a reason) and renews the heartbeat Lease while they pass and the
// instance owns the node (lib is set: a rolling update's new instance waits).
func startProbes(ctx context.Context, cfg *Config, lib *atomic.Pointer[nvml.Interface], engine *atomic.Pointer[prepare.Engine],
	client kubernetes.Interface, fatal context.CancelCauseFunc) error {
	if cfg.ProbeAddress == "" && cfg.HeartbeatPeriod == 0 {
		return nil
	}
	p, err := cfg.prober(func() nvml.Interface {
		if l := lib.Load(); l != nil {
			return *l
		}
		return nil
	}, func() liveness.Stalls {
		if e := engine.Load(); e != nil {
			return e
		}
		return nil
	})
	if err != nil {
		return err
	}
	if cfg.HeartbeatPeriod > 0 {
		hb, err := cfg.heartbeat(client, p, func() bool { return lib.Load() != nil })
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
