package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/driver"
)

// CheckpointFile is the checkpoint's name inside the plugin data directory.
const CheckpointFile = "checkpoint.json"

// Run runs the plugin until ctx is canceled or a fatal error occurs.
func Run(ctx context.Context, cfg *Config) error {
	if cfg.PrintSlices {
		return printSlices(ctx, cfg)
	}
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	if err := os.MkdirAll(cfg.PluginDataDir, 0o750); err != nil {
		return fmt.Errorf("create plugin data directory: %w", err)
	}
	hw, err := openHardware(ctx, cfg, "")
	if err != nil {
		return err
	}
	defer hw.close(ctx)
	gpus, resources, err := discover(ctx, cfg, hw)
	if err != nil {
		return err
	}

	files, err := cdi.DiscoverDriverFiles(hw.driverRoot)
	if err != nil {
		return fmt.Errorf("discover NVIDIA driver files under %s: %w", hw.driverRoot, err)
	}
	drv, err := driver.New(ctx, driver.Options{
		DriverName:     cfg.DriverName,
		PoolName:       cfg.NodeName,
		GPUs:           gpus,
		CDI:            cdi.NewWriter(cfg.CDIDir, hw.driverRoot, files),
		CheckpointPath: filepath.Join(cfg.PluginDataDir, CheckpointFile),
		Fatal:          cancel,
		FaultHook:      cfg.FaultHook,
	})
	if err != nil {
		return err
	}

	client, err := kubeClient(cfg)
	if err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, drv,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDataDir),
		// The driver locks per GPU; serializing all calls would make every
		// claim wait for the slowest one on any GPU.
		kubeletplugin.Serialize(false),
	)
	if err != nil {
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	defer helper.Stop()
	if err := helper.PublishResources(ctx, resources); err != nil {
		if ctx.Err() != nil {
			return shutdown(ctx)
		}
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	logger.Info("Kubelet plugin running", "driver", cfg.DriverName, "node", cfg.NodeName, "gpus", len(gpus))

	<-ctx.Done()
	return shutdown(ctx)
}

// shutdown returns the reason ctx ended: nil for a requested stop, the
// fatal error otherwise.
func shutdown(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	klog.FromContext(ctx).Info("Shutting down")
	return nil
}

func discover(ctx context.Context, cfg *Config, hw *hardware) ([]discovery.GPU, resourceslice.DriverResources, error) {
	gpus, err := discovery.Discover(ctx, hw.nvml, discovery.Options{SysfsRoot: hw.sysfsRoot})
	if err != nil {
		return nil, resourceslice.DriverResources{}, fmt.Errorf("discover GPUs: %w", err)
	}
	return gpus, devicemodel.Build(gpus, devicemodel.Options{NodeName: cfg.NodeName}), nil
}

// printSlices prints what the node would publish. In simulation it works on
// a throw-away copy of the simulated machine, so it never touches the
// plugin's state.
func printSlices(ctx context.Context, cfg *Config) error {
	simDir := ""
	if cfg.Simulate != "" {
		dir, err := os.MkdirTemp("", "gpu-dra-print-slices-")
		if err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(dir) }()
		simDir = dir
	}
	hw, err := openHardware(ctx, cfg, simDir)
	if err != nil {
		return err
	}
	defer hw.close(ctx)
	_, resources, err := discover(ctx, cfg, hw)
	if err != nil {
		return err
	}
	return devicemodel.WriteYAML(cfg.Out, devicemodel.ResourceSlices(resources, cfg.DriverName, cfg.NodeName))
}

func kubeClient(cfg *Config) (kubernetes.Interface, error) {
	if cfg.KubeClient != nil {
		return cfg.KubeClient, nil
	}
	restConfig, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %q: %w", cfg.Kubeconfig, err)
	}
	restConfig.QPS = cfg.KubeAPIQPS
	restConfig.Burst = cfg.KubeAPIBurst
	restConfig.UserAgent = "dra-kubelet-plugin/" + cfg.DriverName
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return nil, fmt.Errorf("create API client: %w", err)
	}
	return client, nil
}
