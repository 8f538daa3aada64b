package hwcheck

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
)

// Report is everything one check found; it is written as Markdown
// (gpu-check-report.md) and JSON (gpu-check-report.json).
type Report struct {
	Mode      string      `json:"mode"` // "real" or "simulated <machine>"
	Started   time.Time   `json:"started"`
	Machine   Machine     `json:"machine"`
	GPUs      []GPUInfo   `json:"gpus"`
	Phases    []Phase     `json:"phases"`
	Timings   []Timing    `json:"timings"`
	Violation []Violation `json:"violations"`
	// ComparedWith is the simulated machine the GPUs were compared with.
	ComparedWith    string           `json:"comparedWith"`
	Differences     []Difference     `json:"differences"`
	CounterProblems []string         `json:"counterProblems"`
	Slices          []SlicesResult   `json:"slices"`
	Prepare         *PrepareResult   `json:"prepare,omitempty"`
	Health          *HealthResult    `json:"health,omitempty"`
	Telemetry       *TelemetryResult `json:"telemetry,omitempty"`
	// Calls are the NVML calls that did not succeed, per phase:
	// method → return code → count.
	Calls map[string]map[string]map[string]int `json:"nvmlCalls"`

	// healthSnap passes the health phase's snapshot to the telemetry phase.
	healthSnap health.Snapshot
}

// Machine describes the host and its NVIDIA stack.
type Machine struct {
	Hostname          string `json:"hostname"`
	Kernel            string `json:"kernel"`
	CPUs              int    `json:"cpus"`
	KernelModule      string `json:"kernelModule"` // /proc/driver/nvidia/version, first line
	NVMLVersion       string `json:"nvmlVersion"`
	DriverVersion     string `json:"driverVersion"`
	CUDADriverVersion string `json:"cudaDriverVersion"`
}

// GPUInfo is one discovered GPU.
type GPUInfo struct {
	Name        string `json:"name"`
	UUID        string `json:"uuid"`
	ProductName string `json:"productName"`
	PCIBusID    string `json:"pciBusID"`
	MemoryBytes uint64 `json:"memoryBytes"`
	MIGCapable  bool   `json:"migCapable"`
	MIGEnabled  bool   `json:"migEnabled"`
}

// Phase is one step of the check; Error is empty when it completed.
type Phase struct {
	Name     string        `json:"name"`
	Duration time.Duration `json:"duration"`
	Error    string        `json:"error,omitempty"`
}

// Timing is one measured operation.
type Timing struct {
	What     string        `json:"what"`
	Duration time.Duration `json:"duration"`
}

// SlicesResult is one --print-slices run.
type SlicesResult struct {
	Policy  string `json:"policy"` // "default" or the file
	File    string `json:"file"`
	Devices int    `json:"devices"`
	// MissingMIG are dynamic MIG devices of the GPUs' profile tables the
	// output lacks (default policy only).
	MissingMIG []string `json:"missingMIG,omitempty"`
}

// PrepareResult is the prepare/unprepare of one whole GPU.
type PrepareResult struct {
	Device     string   `json:"device"`
	CDIDevices []string `json:"cdiDevices"`
	// Paths are the host paths the CDI spec names; Missing those that do
	// not exist.
	Paths   []string `json:"paths"`
	Missing []string `json:"missing,omitempty"`
	// SpecLeft is set when unprepare left the claim's CDI spec behind.
	SpecLeft bool `json:"specLeft,omitempty"`
}

// HealthResult is what the health monitor saw while it watched.
type HealthResult struct {
	Watched time.Duration `json:"watched"`
	Events  []string      `json:"events"`
	// Status per GPU name: healthy, or the reason.
	Status map[string]string `json:"status"`
	// EventsUnsupported are the GPUs NVML delivers no events for.
	EventsUnsupported []string `json:"eventsUnsupported,omitempty"`
}

// TelemetryResult is one scrape of the device metrics.
type TelemetryResult struct {
	// Exported are the metrics the driver can export; Missing, per
	// device (GPU or MIG UUID), those a scrape did not return for it.
	Exported []string            `json:"exported"`
	Missing  map[string][]string `json:"missing"`
	Samples  int                 `json:"samples"`
}

// Findings counts what a clean run has none of: refused setters,
// differences, counter problems, failed phases, missing MIG devices,
// missing CDI paths.
func (r *Report) Findings() []string {
	var out []string
	for _, v := range r.Violation {
		out = append(out, fmt.Sprintf("refused NVML setter %s in phase %s", v.Method, v.Phase))
	}
	for _, d := range r.Differences {
		out = append(out, "difference: "+d.String())
	}
	for _, p := range r.CounterProblems {
		out = append(out, "counters: "+p)
	}
	for _, p := range r.Phases {
		if p.Error != "" {
			out = append(out, fmt.Sprintf("phase %s failed: %s", p.Name, p.Error))
		}
	}
	for _, s := range r.Slices {
		for _, m := range s.MissingMIG {
			out = append(out, fmt.Sprintf("print-slices (%s) lacks MIG device %s", s.Policy, m))
		}
	}
	if r.Prepare != nil {
		for _, m := range r.Prepare.Missing {
			out = append(out, "CDI spec names a missing path: "+m)
		}
		if r.Prepare.SpecLeft {
			out = append(out, "unprepare left the CDI spec behind")
		}
	}
	return out
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteMarkdown writes the report for people (docs/hardware.md takes it).
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# GPU hardware check\n\nMode: %s. Started %s.\n\n", r.Mode, r.Started.UTC().Format(time.RFC3339))

	p("## Machine\n\n| | |\n|---|---|\n")
	m := r.Machine
	for _, row := range [][2]string{{"Host", m.Hostname}, {"Kernel", m.Kernel}, {"CPUs", fmt.Sprint(m.CPUs)},
		{"Kernel module", m.KernelModule}, {"NVML", m.NVMLVersion}, {"Driver", m.DriverVersion}, {"CUDA driver", m.CUDADriverVersion}} {
		p("| %s | %s |\n", row[0], cell(row[1]))
	}
	p("\n| GPU | Product | UUID | PCI | Memory | MIG capable | MIG enabled |\n|---|---|---|---|---|---|---|\n")
	for _, g := range r.GPUs {
		p("| %s | %s | %s | %s | %d MiB | %v | %v |\n", g.Name, g.ProductName, g.UUID, g.PCIBusID, g.MemoryBytes>>20, g.MIGCapable, g.MIGEnabled)
	}

	findings := r.Findings()
	p("\n## Findings\n\n%d finding(s).\n\n", len(findings))
	for _, f := range findings {
		p("- %s\n", f)
	}

	p("\n## Read-only guard\n\n")
	if len(r.Violation) == 0 {
		p("No NVML setter was called.\n")
	} else {
		p("Refused NVML setters (the code path would have changed the GPU):\n\n")
		for _, v := range r.Violation {
			p("- `%s` in phase %s\n", v.Method, v.Phase)
		}
	}

	p("\n## Comparison with the simulated %s\n\n", cell(r.ComparedWith))
	if len(r.Differences) == 0 {
		p("No structural difference.\n")
	} else {
		p("| GPU | What | Simulated | Real |\n|---|---|---|---|\n")
		for _, d := range r.Differences {
			p("| %s | %s | %s | %s |\n", d.GPU, cell(d.What), cell(d.Simulated), cell(d.Real))
		}
	}
	p("\nCounter checks: ")
	if len(r.CounterProblems) == 0 {
		p("every device's consumption fits its GPU's counters, and the counters admit as many instances of each MIG profile as NVML says.\n")
	} else {
		p("\n\n")
		for _, c := range r.CounterProblems {
			p("- %s\n", c)
		}
	}

	p("\n## Print-slices\n\n| Policy | File | Devices | Missing MIG devices |\n|---|---|---|---|\n")
	for _, s := range r.Slices {
		p("| %s | %s | %d | %d |\n", cell(s.Policy), s.File, s.Devices, len(s.MissingMIG))
	}

	p("\n## Prepare and unprepare of a whole GPU\n\n")
	if pr := r.Prepare; pr != nil {
		p("Device %s, CDI devices %s. %d paths named by the CDI spec, %d missing; spec removed on unprepare: %v.\n",
			pr.Device, cell(strings.Join(pr.CDIDevices, ", ")), len(pr.Paths), len(pr.Missing), !pr.SpecLeft)
		for _, m := range pr.Missing {
			p("- missing: `%s`\n", m)
		}
	} else {
		p("Not run (see the phases).\n")
	}

	p("\n## Health\n\n")
	if h := r.Health; h != nil {
		p("Watched for %v: %d event(s).\n\n", h.Watched, len(h.Events))
		for _, e := range h.Events {
			p("- %s\n", e)
		}
		for _, name := range slices.Sorted(maps.Keys(h.Status)) {
			p("- %s: %s\n", name, h.Status[name])
		}
		if len(h.EventsUnsupported) > 0 {
			p("\nNVML delivers no events for: %s.\n", strings.Join(h.EventsUnsupported, ", "))
		}
	}

	p("\n## Telemetry\n\n")
	if t := r.Telemetry; t != nil {
		p("One scrape: %d samples of %d metrics.\n\n", t.Samples, len(t.Exported))
		for _, dev := range slices.Sorted(maps.Keys(t.Missing)) {
			p("- %s lacks: %s\n", dev, strings.Join(t.Missing[dev], ", "))
		}
	}

	p("\n## NVML calls that did not succeed\n\n")
	if len(r.Calls) == 0 {
		p("None.\n")
	} else {
		p("| Phase | Call | Return | Count |\n|---|---|---|---|\n")
		for _, phase := range slices.Sorted(maps.Keys(r.Calls)) {
			for _, method := range slices.Sorted(maps.Keys(r.Calls[phase])) {
				for _, ret := range slices.Sorted(maps.Keys(r.Calls[phase][method])) {
					p("| %s | %s | %s | %d |\n", phase, method, ret, r.Calls[phase][method][ret])
				}
			}
		}
	}

	p("\n## Timings\n\n| What | Duration |\n|---|---|\n")
	for _, t := range r.Timings {
		p("| %s | %v |\n", t.What, t.Duration.Round(time.Microsecond))
	}
	p("\n| Phase | Duration | Result |\n|---|---|---|\n")
	for _, ph := range r.Phases {
		result := "ok"
		if ph.Error != "" {
			result = cell(ph.Error)
		}
		p("| %s | %v | %s |\n", ph.Name, ph.Duration.Round(time.Millisecond), result)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// cell makes s safe in a Markdown table cell.
func cell(s string) string {
	if s == "" {
		return "—"
	}
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
