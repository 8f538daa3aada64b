package nodeplugin

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"

	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/simhooks"
	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry"
)

func healthMonitor(ctx context.Context, cfg *Config, hw *hardware, gpus []discovery.GPU, m *telemetry.DriverMetrics) (*health.Monitor, error) {
	ignored, err := health.ParseXIDs(cfg.IgnoredXIDs)
	if err != nil {
		return nil, fmt.Errorf("--ignored-xids: %w", err)
	}
	uuids := make([]string, 0, len(gpus))
	for _, g := range gpus {
		uuids = append(uuids, g.UUID)
	}
	// The kernel's boot ID (not namespaced, so a container sees the host's);
	// a simulated machine keeps its own in its driver root, which its
	// simulated reboots change.
	bootIDFile := "/proc/sys/kernel/random/boot_id"
	if hw.sim != nil {
		bootIDFile = nvmlsim.BootIDFile(hw.driverRoot)
	}
	mon, err := health.NewMonitor(health.Options{
		NVML: hw.nvml, GPUs: uuids, StateFile: filepath.Join(cfg.PluginDataDir, "health.json"),
		BootIDFile: bootIDFile, IgnoredXIDs: ignored,
		RecoveryWindow: cfg.HealthRecoveryWindow, OnEvent: m.ObserveHealthEvent,
	})
	if mon == nil {
		return nil, fmt.Errorf("health monitor: %w", err)
	}
	if err != nil {
		// A corrupt state file was moved aside; every GPU starts healthy.
		klog.FromContext(ctx).Error(err, "Health state not restored")
	}
	return mon, nil
}

// taintPolicy is the default taint policy with --health-taint-effects
// applied; a value that does not parse is logged and ignored.
func taintPolicy(ctx context.Context, cfg *Config) health.TaintPolicy {
	policy := health.DefaultTaintPolicy(cfg.DriverName)
	if cfg.HealthTaintEffects != "" {
		effects, err := health.ParseTaintEffects(cfg.HealthTaintEffects)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Ignoring --health-taint-effects")
		} else {
			policy.Effects = effects
		}
	}
	return policy
}

// metricsSecurity is how the metrics server guards itself, by
// --metrics-auth and the TLS flags.
func metricsSecurity(cfg *Config, client kubernetes.Interface) (telemetry.Security, error) {
	sec := telemetry.Security{CertFile: cfg.MetricsCertFile, KeyFile: cfg.MetricsKeyFile}
	if cfg.MetricsAuth == MetricsAuthDelegated {
		auth, err := telemetry.DelegatedAuth(client)
		if err != nil {
			return sec, fmt.Errorf("--metrics-auth=%s: %w", MetricsAuthDelegated, err)
		}
		sec.Auth = auth
	}
	return sec, nil
}

// serveMetrics serves /metrics and, in simulation, simhooks.EventPath,
// which injects NVML events into the simulated GPUs.
func serveMetrics(ctx context.Context, cfg *Config, hw *hardware, reg metrics.KubeRegistry, sec telemetry.Security) {
	extra := map[string]http.Handler{}
	if hw.sim != nil {
		extra[simhooks.EventPath] = simhooks.EventHandler(hw.sim, hw.saveWedge)
	}
	if cfg.LocalMetricsAddress != "" {
		// Readings only: no simulation hooks on the unauthenticated port.
		go func() {
			if err := telemetry.Serve(ctx, cfg.LocalMetricsAddress, reg, nil, telemetry.Security{}); err != nil {
				klog.FromContext(ctx).Error(err, "Local metrics server", "address", cfg.LocalMetricsAddress)
			}
		}()
	}
	if err := telemetry.Serve(ctx, cfg.MetricsAddress, reg, extra, sec); err != nil {
		klog.FromContext(ctx).Error(err, "Metrics server", "address", cfg.MetricsAddress)
	}
}
