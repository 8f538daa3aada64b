package nodeplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/coexistence"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/passthrough"
	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
	"github.com/gpu-dra/gpu-dra-driver/pkg/publisher"
	"github.com/gpu-dra/gpu-dra-driver/pkg/reserve"
	"github.com/gpu-dra/gpu-dra-driver/pkg/staleclaims"
	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// CheckpointFile is the checkpoint's name inside the plugin data directory.
const CheckpointFile = "checkpoint.json"

// ReserveFile, in the plugin data directory, keeps the reserve policy's
// spare GPUs across restarts.
const ReserveFile = "reserve.json"

// InventoryFile, in the plugin data directory, keeps the GPUs the last
// discovery found, for those a restart finds bound to vfio-pci.
const InventoryFile = "gpus.json"

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
	client, err := kubeClient(cfg)
	if err != nil {
		return err
	}
	srv := newServing(cancel)
	// Last, after the hand-over lock went: the calls forwarded to the newer instance wait for it.
	defer srv.close(ctx)
	if cfg.PodUID != "" { // a rolling update: register, then wait for the old instance (docs/operations.md, Upgrade)
		if err := srv.start(ctx, cfg, client, cancel); err != nil {
			return err
		}
	}
	lock, err := srv.acquire(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return shutdown(ctx)
		}
		return err
	}
	defer func() { srv.stop(ctx); lock.Release(ctx) }() // nothing mutates after

	hw, err := openHardware(ctx, cfg, "")
	if err != nil {
		return err
	}
	defer hw.close(ctx)
	// mutators are the goroutines that change node state (checkpoint, CDI
	// specs, MIG, sharing) besides the kubelet's calls, which srv.stop
	// drains: they end before NVML closes and the hand-over lock goes, so
	// nothing rewrites the node after the next owner loaded it.
	var mutators sync.WaitGroup
	defer func() { cancel(nil); mutators.Wait() }()
	policy, err := devicemodel.LoadPolicy(cfg.DevicePolicyFile)
	if err != nil {
		return err
	}
	files, err := cdi.DiscoverDriverFiles(hw.driverRoot)
	if err != nil {
		return fmt.Errorf("discover NVIDIA driver files under %s: %w", hw.driverRoot, err)
	}
	ts, mps, err := sharingManagers(ctx, cfg, hw, client)
	if err != nil {
		return err
	}
	metrics := telemetry.NewDriverMetrics(cfg.NodeName)
	checkpointPath := filepath.Join(cfg.PluginDataDir, CheckpointFile)
	opts := prepare.Options{
		DriverName:     cfg.DriverName,
		PoolName:       cfg.NodeName,
		MIG:            mig.NewNode(hw.nvml, hw.driverRoot),
		Store:          checkpoint.NewFileStore(checkpointPath),
		CDI:            cdi.NewWriter(cfg.CDIDir, hw.driverRoot, files, append(hw.cdiOptions, cdi.WithHostDriverRoot(hw.hostDriverRoot))...),
		TimeSlicing:    ts,
		Metrics:        metrics,
		CheckpointPath: checkpointPath,
		Fatal:          cancel,
		FaultHook:      hw.faultHook(cfg.FaultHook),
		Passthrough:    passthrough.Host{Sysfs: passthrough.Sysfs{Root: hw.sysfsRoot}, NVML: hw.nvml},
	}
	if mps != nil { // a nil *MPSManager in the interface would not be nil
		opts.MPS = mps
	}
	if cfg.MetricsAddress != "" { // pods are looked up only for the container label
		opts.Pods, opts.Claims = client.CoreV1(), client.ResourceV1()
	}
	channels, err := imexNode(ctx, cfg, hw, client)
	if err != nil {
		return err
	}
	if channels != nil { // a nil *imexdomain.Node in the interface would not be nil
		opts.Channels = channels
	}
	drv, err := prepare.New(ctx, opts)
	if err != nil {
		return err
	}
	// Discovery runs after New's recovery, which may destroy MIG instances
	// a crashed prepare left: they must not be published as static MIG
	// devices, nor measured.
	node, err := discoverNode(ctx, hw, devicemodel.Options{
		NodeName: cfg.NodeName, Policy: policy, OwnedMIG: drv.OwnsMIG, NoMPS: mps == nil,
	}, discovery.Options{InventoryFile: filepath.Join(cfg.PluginDataDir, InventoryFile), WriteInventory: true})
	if err != nil {
		return err
	}
	monitor, err := healthMonitor(ctx, cfg, hw, node.gpus, metrics)
	if err != nil {
		return err
	}
	if channels != nil {
		// Before the kubelet's calls: the daemon the checkpoint's channels
		// hold is adopted or restarted, one no claim holds stopped.
		channels.SetClique(cliqueOf(ctx, node.gpus))
		if err := channels.Recover(ctx, drv.HeldDomains()); err != nil {
			return fmt.Errorf("recover IMEX daemons: %w", err)
		}
		mutators.Go(func() { channels.Run(ctx) })
	}
	drv.SetHealth(monitor)
	drv.SetDevices(ctx, node.published)
	if err := monitor.Start(ctx); err != nil {
		return fmt.Errorf("start health monitor: %w", err)
	}
	defer func() { <-monitor.Done() }() // before NVML shuts down

	if err := srv.own(ctx, cfg, client, cancel, drv, hw.nvml); err != nil {
		return err
	}
	var target publisher.Target = srv.slices
	if cfg.DevicePluginCheckPeriod > 0 { // never publish beside a device plugin (docs/migration.md)
		gate := coexistence.New(coexistence.Options{Client: client, NodeName: cfg.NodeName, DriverName: cfg.DriverName,
			Target: srv.slices, Period: cfg.DevicePluginCheckPeriod})
		go gate.Run(ctx)
		target = gate
	}
	stale, err := staleReleaser(cfg, client, drv, hw.nvml)
	if err != nil {
		return err
	}
	hide, err := reservePolicy(ctx, cfg, client, policy.Reserve)
	if err != nil {
		return err
	}
	go publisher.Run(ctx, publisher.Options{
		Target: target, Health: monitor, Resources: node.resources, Devices: drv.HealthDevices,
		Policy: taintPolicy(ctx, cfg),
		// Devices that what is prepared makes impossible to allocate are
		// withdrawn, one slice update at a time.
		Pool: cfg.NodeName, Prepared: drv, Stored: publisher.WatchSlices(ctx, client, cfg.DriverName, cfg.NodeName),
		Reserve: hide,
	})
	if cfg.MetricsAddress != "" {
		sec, err := metricsSecurity(cfg, client)
		if err != nil {
			return err
		}
		collector := telemetry.NewCollector(telemetry.CollectorOptions{
			NVML: hw.nvml, NodeName: cfg.NodeName, GPUs: node.gpus, Holders: drv, Health: monitor, Processes: drv.ProcessOwners(),
			MIGDeviceName: devicemodel.StaticMIGDeviceName, DCGM: cfg.DCGMMetrics, XIDs: metrics,
		})
		reg := telemetry.NewRegistry(metrics, collector)
		if stale != nil {
			stale.Metrics().MustRegister(reg)
		}
		if channels != nil {
			channels.Metrics().MustRegister(reg)
		}
		go serveMetrics(ctx, cfg, hw, reg, sec)
	}
	if stale != nil {
		mutators.Go(func() { stale.Run(ctx) })
	}
	logger.Info("Kubelet plugin running", "driver", cfg.DriverName, "node", cfg.NodeName, "gpus", len(node.gpus))

	<-ctx.Done()
	srv.stop(ctx) // before the deferred health monitor wait, mutators' end, NVML shutdown and hand-over
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
	policy, err := devicemodel.LoadPolicy(cfg.DevicePolicyFile)
	if err != nil {
		return err
	}
	node, err := discoverNode(ctx, hw, devicemodel.Options{
		NodeName: cfg.NodeName, Policy: policy,
		OwnedMIG: ownedMIG(ctx, filepath.Join(cfg.PluginDataDir, CheckpointFile)), NoMPS: mpsControl(cfg, hw) == "",
	}, discovery.Options{InventoryFile: filepath.Join(cfg.PluginDataDir, InventoryFile)})
	if err != nil {
		return err
	}
	return devicemodel.WriteYAML(cfg.Out, devicemodel.ResourceSlices(node.resources, cfg.DriverName, cfg.NodeName))
}

// node is what discovery found and the device model makes of it.
type node struct {
	gpus      []discovery.GPU
	published []devicemodel.Published
	resources resourceslice.DriverResources
}

// discoverNode discovers the GPUs and models the devices the node
// publishes: the one entry point of Run and --print-slices, so what
// --print-slices prints is what the plugin publishes. dopts names the
// inventory (the sysfs root is the hardware's).
func discoverNode(ctx context.Context, hw *hardware, opts devicemodel.Options, dopts discovery.Options) (node, error) {
	dopts.SysfsRoot = hw.sysfsRoot
	gpus, err := discovery.Discover(ctx, hw.nvml, dopts)
	if err != nil {
		return node{}, fmt.Errorf("discover GPUs: %w", err)
	}
	published, counterSets := devicemodel.Model(gpus, opts)
	return node{gpus: gpus, published: published, resources: devicemodel.Resources(opts.NodeName, published, counterSets)}, nil
}

// ownedMIG reads, without changing anything, which MIG instances the
// running plugin created, so --print-slices shows them as it does.
func ownedMIG(ctx context.Context, checkpointPath string) func(string, uint32) bool {
	cp, err := checkpoint.NewFileStore(checkpointPath).Load(ctx)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("No readable checkpoint; treating all MIG instances as static", "err", err)
		return nil
	}
	return cp.OwnsMIG
}

func kubeClient(cfg *Config) (kubernetes.Interface, error) {
	if cfg.KubeClient != nil {
		return cfg.KubeClient, nil
	}
	return cfg.Options.New(nil, vocabulary.KubeletPluginAgent+"/"+cfg.DriverName)
}

// staleReleaser releases the claims the kubelet will never unprepare; nil
// when --stale-claim-grace-period is 0.
// Before a release it asks the kubelet, the API server and NVML whether a
// container may still use the claim.
func staleReleaser(cfg *Config, client kubernetes.Interface, drv *prepare.Engine, nvml nvml.Interface) (*staleclaims.Releaser, error) {
	if cfg.StaleClaimGracePeriod == 0 {
		return nil, nil
	}
	return staleclaims.New(staleclaims.Options{
		Client: client, Engine: drv, DriverName: cfg.DriverName, PoolName: cfg.NodeName, NodeName: cfg.NodeName,
		GracePeriod: cfg.StaleClaimGracePeriod, PodResourcesSocket: cfg.PodResourcesSocket, NVML: nvml,
	})
}

// reservePolicy follows the pool's allocations and keeps the spare GPUs
// when the device policy enables the reserve policy; nil otherwise.
func reservePolicy(ctx context.Context, cfg *Config, client kubernetes.Interface, policy devicemodel.ReservePolicy) (publisher.Reserve, error) {
	if !policy.Enabled() {
		return nil, nil
	}
	tracker, err := reserve.New(ctx, reserve.Options{
		Policy:    policy,
		Allocated: reserve.WatchAllocations(ctx, client, cfg.DriverName, cfg.NodeName),
		StateFile: filepath.Join(cfg.PluginDataDir, ReserveFile),
	})
	if err != nil {
		return nil, err
	}
	return tracker, nil
}
