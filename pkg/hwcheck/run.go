package hwcheck

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// Report file names in Config.OutDir.
const (
	ReportMarkdown = "gpu-check-report.md"
	ReportJSON     = "gpu-check-report.json"
)

// check is one run: its configuration, the guarded NVML and the report
// being filled in.
type check struct {
	cfg   Config
	guard *Guard
	nvml  nvml.Interface
	gpus  []discovery.GPU
	// healthSnap is the health phase's result, for the telemetry phase.
	healthSnap health.Snapshot
	work       string
	report     *Report
}

// phaseFunc is one phase. It writes what it finds into r, which is merged
// into the report when the phase returns in time: a phase abandoned in a
// hung call can never race with the report being written.
type phaseFunc func(ctx context.Context, r *Report) error

// Run runs every phase, writes the report to cfg.OutDir and returns an
// error when the check could not run, or, with ExpectClean, when the
// report has findings. A failing phase is recorded and the next runs.
func Run(ctx context.Context, cfg Config) error {
	// Short: the plugin's unix sockets live below it.
	work, err := os.MkdirTemp("", "gpuchk-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(work) }()
	return run(ctx, cfg, work)
}

// run is Run in the work directory work.
func run(ctx context.Context, cfg Config, work string) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithTimeout(ctx, cfg.Deadline)
	defer cancel()
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return fmt.Errorf("create --out directory: %w", err)
	}
	c := &check{cfg: cfg, guard: NewGuard(), work: work, report: &Report{Mode: "real", Started: time.Now()}}
	if cfg.Hardware.Simulate != "" {
		c.report.Mode = "simulated " + cfg.Hardware.Simulate
	}
	c.report.Machine = hostFacts()

	opened := c.phase(ctx, "nvml-init", c.openNVML)
	if opened {
		defer c.nvml.Shutdown()
		if c.phase(ctx, "discovery", c.discover) {
			c.phase(ctx, "print-slices", c.printSlices)
			c.phase(ctx, "compare", c.compare)
			c.phase(ctx, "prepare", c.prepare)
			c.phase(ctx, "health", c.health)
			c.phase(ctx, "telemetry", c.telemetry)
		}
	}
	c.report.Violation = c.guard.Violations()
	c.report.Calls = failedCalls(c.guard.Calls())
	if err := c.write(); err != nil {
		return err
	}
	findings := c.report.Findings()
	logger.Info("Hardware check done", "mode", c.report.Mode, "findings", len(findings), "report", filepath.Join(cfg.OutDir, ReportMarkdown))
	if !opened {
		return fmt.Errorf("NVML did not start: %s", c.report.Phases[0].Error)
	}
	if cfg.ExpectClean && len(findings) > 0 {
		return fmt.Errorf("%d finding(s), none expected:\n  %s", len(findings), strings.Join(findings, "\n  "))
	}
	return nil
}

// phase runs fn under the phase timeout and records how it went. A phase
// stuck in a call that ignores its context (an NVML call that hangs) is
// abandoned when the timeout passes.
func (c *check) phase(ctx context.Context, name string, fn phaseFunc) bool {
	logger := klog.FromContext(ctx)
	if ctx.Err() != nil {
		c.report.Phases = append(c.report.Phases, Phase{Name: name, Error: "skipped: " + context.Cause(ctx).Error()})
		return false
	}
	logger.Info("Phase", "name", name)
	c.guard.SetPhase(name)
	ctx, cancel := context.WithTimeout(ctx, c.cfg.PhaseTimeout)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	found := &Report{}
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("panic: %v", r)
			}
		}()
		done <- fn(ctx, found)
	}()
	var err error
	select {
	case err = <-done:
		c.merge(found)
	case <-ctx.Done():
		err = fmt.Errorf("did not finish: %w", context.Cause(ctx))
	}
	ph := Phase{Name: name, Duration: time.Since(start)}
	if err != nil {
		ph.Error = err.Error()
		logger.Error(err, "Phase failed", "name", name)
	}
	c.report.Phases = append(c.report.Phases, ph)
	return err == nil
}

// merge adds what a phase found to the report.
func (c *check) merge(f *Report) {
	r := c.report
	for _, p := range []struct{ to, from *string }{
		{&r.Machine.NVMLVersion, &f.Machine.NVMLVersion}, {&r.Machine.DriverVersion, &f.Machine.DriverVersion},
		{&r.Machine.CUDADriverVersion, &f.Machine.CUDADriverVersion}, {&r.ComparedWith, &f.ComparedWith},
	} {
		if *p.from != "" {
			*p.to = *p.from
		}
	}
	r.GPUs = append(r.GPUs, f.GPUs...)
	r.Timings = append(r.Timings, f.Timings...)
	r.Slices = append(r.Slices, f.Slices...)
	r.Differences = append(r.Differences, f.Differences...)
	r.CounterProblems = append(r.CounterProblems, f.CounterProblems...)
	if f.Prepare != nil {
		r.Prepare = f.Prepare
	}
	if f.Health != nil {
		r.Health = f.Health
	}
	if f.Telemetry != nil {
		r.Telemetry = f.Telemetry
	}
	if f.healthSnap != nil {
		c.healthSnap = f.healthSnap
	}
}

// timing records how long what took since start.
func (r *Report) timing(what string, start time.Time) {
	r.Timings = append(r.Timings, Timing{What: what, Duration: time.Since(start)})
}

// openNVML opens the real NVML, or a simulated machine with its driver
// root and sysfs written below the work directory, behind the guard.
func (c *check) openNVML(_ context.Context, r *Report) error {
	var lib nvml.Interface
	if c.cfg.Hardware.Simulate == "" {
		lib = nvml.New(nvml.WithLibraryPath(c.cfg.Hardware.NVMLLibraryPath))
	} else {
		m, err := nvmlsim.New(c.cfg.Hardware.Simulate, nvmlsim.WithSeed(c.cfg.NodeName))
		if err != nil {
			return err
		}
		c.cfg.Hardware.DriverRoot = filepath.Join(c.work, "driver-root")
		c.cfg.Hardware.SysfsRoot = filepath.Join(c.work, "sys")
		if err := m.WriteDriverRoot(c.cfg.Hardware.DriverRoot); err != nil {
			return fmt.Errorf("write simulated driver root: %w", err)
		}
		if err := m.WriteSysfs(c.cfg.Hardware.SysfsRoot); err != nil {
			return fmt.Errorf("write simulated sysfs: %w", err)
		}
		lib = m
	}
	c.nvml = c.guard.Wrap(lib)
	start := time.Now()
	if ret := c.nvml.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("initialize NVML (%s): %w", c.cfg.Hardware.NVMLLibraryPath, ret)
	}
	r.timing("NVML init", start)
	if v, ret := c.nvml.SystemGetNVMLVersion(); ret == nvml.SUCCESS {
		r.Machine.NVMLVersion = v
	}
	return nil
}

func (c *check) discover(ctx context.Context, r *Report) error {
	start := time.Now()
	gpus, err := discovery.Discover(ctx, c.nvml, discovery.Options{SysfsRoot: c.cfg.Hardware.SysfsRoot})
	if err != nil {
		return err
	}
	r.timing("discovery", start)
	if len(gpus) == 0 {
		return errors.New("no GPU found")
	}
	c.gpus = gpus
	r.Machine.DriverVersion = gpus[0].DriverVersion
	r.Machine.CUDADriverVersion = gpus[0].CUDADriverVersion
	for _, g := range gpus {
		r.GPUs = append(r.GPUs, GPUInfo{
			Name: g.CanonicalName(), UUID: g.UUID, ProductName: g.ProductName, PCIBusID: g.PCIBusID,
			MemoryBytes: g.MemoryBytes, MIGCapable: g.MIGCapable, MIGEnabled: g.MIGEnabled,
		})
	}
	return nil
}

func (c *check) write() error {
	for name, write := range map[string]func(f *os.File) error{
		ReportMarkdown: func(f *os.File) error { return c.report.WriteMarkdown(f) },
		ReportJSON:     func(f *os.File) error { return c.report.WriteJSON(f) },
	} {
		f, err := os.Create(filepath.Join(c.cfg.OutDir, name))
		if err != nil {
			return err
		}
		err = errors.Join(write(f), f.Close())
		if err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// failedCalls keeps the NVML calls that returned anything but SUCCESS.
func failedCalls(calls map[string]map[string]map[string]int) map[string]map[string]map[string]int {
	out := map[string]map[string]map[string]int{}
	for phase, methods := range calls {
		for method, rets := range methods {
			for ret, n := range rets {
				if ret == "SUCCESS" {
					continue
				}
				if out[phase] == nil {
					out[phase] = map[string]map[string]int{}
				}
				if out[phase][method] == nil {
					out[phase][method] = map[string]int{}
				}
				out[phase][method][ret] = n
			}
		}
	}
	return out
}

// hostFacts reads what identifies the host, without NVML.
func hostFacts() Machine {
	m := Machine{CPUs: runtime.NumCPU()}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/driver/nvidia/version"); err == nil {
		m.KernelModule, _, _ = strings.Cut(strings.TrimSpace(string(b)), "\n")
	}
	return m
}
