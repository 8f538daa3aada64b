package hwcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun/inprocess"
	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// prepare runs the real plugin (pkg/nodeplugin) behind the guard against a fake
// API server holding one claim for a whole GPU, allocated by the upstream
// allocator from the node's slices; the kubelet stand-in prepares and
// unprepares it over the plugin's unix sockets. Every host path the CDI
// spec names (device nodes, libraries, binaries, hooks) must exist.
func (c *check) prepare(ctx context.Context, r *Report) error {
	dirs, err := pluginrun.NewDirs(filepath.Join(c.work, "n"))
	if err != nil {
		return err
	}
	slices := devicemodel.ResourceSlices(devicemodel.Build(c.gpus, devicemodel.Options{NodeName: c.cfg.NodeName}), vocabulary.DriverName, c.cfg.NodeName)
	cluster := at.NewCluster(slices, deviceclass.DeviceClasses(vocabulary.DriverName))
	allocated, err := cluster.Allocate(ctx, c.cfg.NodeName, at.Claim("gpu-check", at.Exactly("gpu", vocabulary.DriverName, 1)))
	if err != nil {
		return fmt.Errorf("allocate a whole GPU: %w", err)
	}
	claim := allocated[0]
	res := &PrepareResult{Device: claim.Status.Allocation.Devices.Results[0].Device}
	r.Prepare = res

	cfg := c.cfg.pluginConfig()
	cfg.PluginDataDir, cfg.RegistrarDir, cfg.CDIDir = dirs.PluginData, dirs.Registrar, dirs.CDI
	cfg.MPSDir = filepath.Join(dirs.Root, "mps")
	cfg.HealthRecoveryWindow = time.Minute
	cfg.KubeClient = apiserver.NodeClient(c.cfg.NodeName, claim)
	cfg.WrapNVML = c.guard.Wrap
	if err := cfg.Validate(); err != nil {
		return err
	}
	start := time.Now()
	plugin, err := inprocess.Start(ctx, cfg)
	if err != nil {
		return fmt.Errorf("start the plugin: %w", err)
	}
	r.timing("plugin start to registration", start)
	stopped := false
	defer func() {
		if !stopped {
			_ = plugin.Stop()
		}
	}()

	start = time.Now()
	ids, err := plugin.Kubelet.PrepareOne(ctx, claim)
	if err != nil {
		return err
	}
	r.timing("prepare of a whole GPU", start)
	res.CDIDevices = ids
	specs, err := claimSpecs(dirs.CDI)
	if err != nil {
		return err
	}
	if len(specs) != 1 {
		return fmt.Errorf("prepare wrote %d CDI specs, want 1", len(specs))
	}
	res.Paths, err = specPaths(specs[0])
	if err != nil {
		return err
	}
	for _, p := range res.Paths {
		if _, err := os.Stat(p); err != nil {
			res.Missing = append(res.Missing, p)
		}
	}

	start = time.Now()
	if err := plugin.Kubelet.UnprepareOne(ctx, claim); err != nil {
		return err
	}
	r.timing("unprepare of a whole GPU", start)
	if left, err := claimSpecs(dirs.CDI); err != nil || len(left) > 0 {
		res.SpecLeft = len(left) > 0
		if err != nil {
			return err
		}
	}
	stopped = true
	return plugin.Stop()
}

func claimSpecs(dir string) ([]string, error) {
	return filepath.Glob(filepath.Join(dir, "*.json"))
}

// specPaths lists the host paths a CDI spec file names, sorted.
func specPaths(file string) ([]string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("parse CDI spec %s: %w", file, err)
	}
	var paths []string
	add := func(e cdispec.ContainerEdits) {
		for _, d := range e.DeviceNodes {
			if d.HostPath != "" {
				paths = append(paths, d.HostPath)
			} else {
				paths = append(paths, d.Path)
			}
		}
		for _, m := range e.Mounts {
			paths = append(paths, m.HostPath)
		}
		for _, h := range e.Hooks {
			paths = append(paths, h.Path)
		}
	}
	add(spec.ContainerEdits)
	for _, d := range spec.Devices {
		add(d.ContainerEdits)
	}
	if len(paths) == 0 {
		return nil, errors.New("the CDI spec names no path")
	}
	slices.Sort(paths)
	return slices.Compact(paths), nil
}
