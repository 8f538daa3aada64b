package nodeplugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mpspod"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim/simhooks"
	"github.com/gpu-dra/gpu-dra-driver/pkg/sharing"
)

// sharingManagers builds the time-slicing and MPS managers. MPS is nil when
// no control program is found; the node then publishes no MPS shares.
func sharingManagers(ctx context.Context, cfg *Config, hw *hardware, client kubernetes.Interface) (*sharing.TimeSlicingManager, *sharing.MPSManager, error) {
	modes := sharing.NewNVMLComputeModes(hw.nvml)
	var slicer sharing.TimeSlicer = &sharing.NvidiaSMITimeSlicer{Path: filepath.Join(hw.driverRoot, "usr/bin/nvidia-smi")}
	if hw.sim != nil {
		slicer = simhooks.NewTimeSlicer(hw.sim)
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
	opts := sharing.MPSOptions{
		Dir: cfg.MPSDir, ControlBinary: control, ComputeModes: modes,
		Env: []string{"LD_LIBRARY_PATH=" + filepath.Join(hw.driverRoot, "usr/lib/x86_64-linux-gnu")},
	}
	if cfg.MPSDaemonImage != "" {
		if opts.Launcher, err = mpsPodLauncher(ctx, cfg, hw, client, control); err != nil {
			return nil, nil, fmt.Errorf("MPS: %w", err)
		}
		// A pod starts in seconds, not milliseconds; the kubelet gives a
		// prepare call 45 s.
		opts.StartTimeout = 40 * time.Second
		if cfg.MPSShmSize != "" {
			size := resource.MustParse(cfg.MPSShmSize) // checked by Validate
			opts.ShmSize = size.Value()
		}
	}
	mps, err := sharing.NewMPSManager(opts)
	if err != nil {
		return nil, nil, fmt.Errorf("MPS: %w", err)
	}
	return ts, mps, nil
}

// mpsPodLauncher runs the MPS control daemons as pods owned by the plugin's
// DaemonSet, so that they outlive the plugin's container (pkg/mpspod).
func mpsPodLauncher(ctx context.Context, cfg *Config, hw *hardware, client kubernetes.Interface, control string) (*mpspod.Launcher, error) {
	if cfg.PodName == "" || cfg.PodNamespace == "" {
		return nil, errors.New("--mps-daemon-image needs --pod-name and --pod-namespace (POD_NAME and POD_NAMESPACE from the downward API)")
	}
	owner, err := mpspod.OwnerOf(ctx, client, cfg.PodNamespace, cfg.PodName)
	if err != nil {
		return nil, err
	}
	opts := mpspod.Options{
		Client: client, Namespace: cfg.PodNamespace, NodeName: cfg.NodeName, DriverName: cfg.DriverName,
		Image: cfg.MPSDaemonImage, Owner: owner, PriorityClassName: cfg.MPSDaemonPriorityClass,
		ServiceAccountName: cfg.MPSDaemonServiceAccount,
	}
	if cfg.MPSDaemonDisruptionBudget != "" {
		// Without it only drain is affected: not worth failing the node's GPUs.
		if opts.Budget, err = mpspod.BudgetOf(ctx, client, cfg.PodNamespace, cfg.MPSDaemonDisruptionBudget); err != nil {
			klog.FromContext(ctx).Error(err, "MPS control daemon pods get no controller; kubectl drain of this node needs --force and may stop daemons before their clients")
		}
	}
	if hw.driverRoot != "/" {
		// The control program and its libraries, where the plugin sees them.
		opts.Mounts = append(opts.Mounts, cdi.Mount{HostPath: hw.hostDriverRoot, ContainerPath: hw.driverRoot, ReadOnly: true})
	}
	klog.FromContext(ctx).Info("MPS control daemons run as pods", "namespace", cfg.PodNamespace, "image", cfg.MPSDaemonImage, "owner", owner.Kind+"/"+owner.Name, "control", control)
	return mpspod.New(opts)
}

// mpsControl chooses nvidia-cuda-mps-control: the flag, else the driver
// root's, else — in simulation — the simulated one beside the plugin.
func mpsControl(cfg *Config, hw *hardware) string {
	switch {
	case cfg.MPSControl != "":
		return cfg.MPSControl
	case hw.sim != nil:
		return simhooks.MPSControl()
	default:
		return sharing.FindMPSControl(hw.driverRoot)
	}
}
