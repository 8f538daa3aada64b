package hwcheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"sigs.k8s.io/yaml"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// printSlices runs the plugin's --print-slices, behind the guard, with the
// default policy (everything a GPU supports) and with the chosen one, and
// checks that the default lists every dynamic MIG placement of every MIG
// capable GPU's profile table, also while MIG mode is off.
func (c *check) printSlices(ctx context.Context, found *Report) error {
	runs := []struct{ policy, file string }{{"", "slices-default.yaml"}}
	if c.cfg.DevicePolicyFile != "" {
		runs = append(runs, struct{ policy, file string }{c.cfg.DevicePolicyFile, "slices-policy.yaml"})
	}
	var errs []error
	for _, r := range runs {
		var out bytes.Buffer
		cfg := c.cfg.pluginConfig()
		cfg.PrintSlices, cfg.Out, cfg.DevicePolicyFile = true, &out, r.policy
		cfg.PluginDataDir = filepath.Join(c.work, "print-slices")
		cfg.WrapNVML = c.guard.Wrap
		if err := nodeplugin.Run(ctx, cfg); err != nil {
			errs = append(errs, fmt.Errorf("--print-slices (policy %q): %w", r.policy, err))
			continue
		}
		if err := os.WriteFile(filepath.Join(c.cfg.OutDir, r.file), out.Bytes(), 0o644); err != nil {
			return err
		}
		devices, err := printedDevices(out.Bytes())
		if err != nil {
			errs = append(errs, fmt.Errorf("--print-slices (policy %q): %w", r.policy, err))
			continue
		}
		res := SlicesResult{Policy: r.policy, File: r.file, Devices: len(devices)}
		if r.policy == "" {
			res.Policy = "default"
			res.MissingMIG = missingMIG(c.gpus, devices)
		}
		found.Slices = append(found.Slices, res)
	}
	return errors.Join(errs...)
}

// printedDevices reads the names of the devices in a --print-slices
// YAML stream.
func printedDevices(stream []byte) (map[string]bool, error) {
	names := map[string]bool{}
	for i, doc := range bytes.Split(stream, []byte("---\n")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var s resourceapi.ResourceSlice
		if err := yaml.UnmarshalStrict(doc, &s); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		for _, d := range s.Spec.Devices {
			names[d.Name] = true
		}
	}
	return names, nil
}

// missingMIG lists the dynamic MIG devices of the GPUs' profile tables
// that the printed devices lack.
func missingMIG(gpus []discovery.GPU, printed map[string]bool) []string {
	var missing []string
	for i := range gpus {
		g := &gpus[i]
		if g.MIG == nil || len(g.MIG.Instances) > 0 { // static MIG publishes the instances instead
			continue
		}
		for _, p := range g.MIG.Profiles {
			for _, pl := range p.Placements {
				name := devicemodel.MIGDeviceName(g, p.Name, pl.Start)
				if !printed[name] {
					missing = append(missing, name)
				}
			}
		}
	}
	return missing
}

// compare compares every GPU with the first GPU of the simulated machine
// of its model, and checks the counters of both.
func (c *check) compare(ctx context.Context, r *Report) error {
	machine := c.cfg.CompareWith
	if machine == "" {
		var err error
		if machine, err = machineFor(c.gpus[0].ProductName); err != nil {
			return err
		}
	}
	r.ComparedWith = machine
	sim, err := discoverSimulated(ctx, machine, filepath.Join(c.work, "compare-sys"))
	if err != nil {
		return err
	}
	simShape := ShapeOf(sim[0], devicemodel.Options{NodeName: c.cfg.NodeName})
	r.CounterProblems = append(r.CounterProblems, prefixed("simulated ", CheckCounters(simShape))...)
	for _, g := range c.gpus {
		shape := ShapeOf(g, devicemodel.Options{NodeName: c.cfg.NodeName})
		r.Differences = append(r.Differences, Compare(shape, simShape)...)
		r.CounterProblems = append(r.CounterProblems, CheckCounters(shape)...)
	}
	return nil
}

func prefixed(prefix string, ss []string) []string {
	for i := range ss {
		ss[i] = prefix + ss[i]
	}
	return ss
}

// machineFor picks the simulated machine whose GPUs have this product
// name, or else the one whose product name is the longest prefix of it
// ("NVIDIA H200" for an "NVIDIA H200 NVL"; the name difference is then in
// the report).
func machineFor(product string) (string, error) {
	var seen []string
	best, bestName := "", ""
	for _, name := range nvmlsim.Machines() {
		m, err := nvmlsim.New(name)
		if err != nil {
			return "", err
		}
		got, err := firstProductName(m)
		if err != nil {
			return "", fmt.Errorf("simulated %s: %w", name, err)
		}
		if got == product {
			return name, nil
		}
		if strings.HasPrefix(product, got+" ") && len(got) > len(bestName) {
			best, bestName = name, got
		}
		seen = append(seen, fmt.Sprintf("%s (%s)", name, got))
	}
	if best != "" {
		return best, nil
	}
	return "", fmt.Errorf("no simulated machine has %q GPUs (simulated: %s); give --compare-with", product, strings.Join(seen, ", "))
}

func firstProductName(m *nvmlsim.Machine) (string, error) {
	if ret := m.Init(); ret != nvml.SUCCESS {
		return "", ret
	}
	defer m.Shutdown()
	dev, ret := m.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		return "", ret
	}
	name, ret := dev.GetName()
	if ret != nvml.SUCCESS {
		return "", ret
	}
	return name, nil
}

// discoverSimulated runs discovery over a fresh simulated machine.
func discoverSimulated(ctx context.Context, machine, sysfs string) ([]discovery.GPU, error) {
	m, err := nvmlsim.New(machine)
	if err != nil {
		return nil, err
	}
	if err := m.WriteSysfs(sysfs); err != nil {
		return nil, fmt.Errorf("write simulated sysfs: %w", err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("initialize simulated %s: %w", machine, ret)
	}
	defer m.Shutdown()
	return discovery.Discover(ctx, m, discovery.Options{SysfsRoot: sysfs})
}
