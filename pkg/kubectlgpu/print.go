package kubectlgpu

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Output formats of -o.
const (
	OutputTable = ""
	OutputWide  = "wide"
	OutputJSON  = "json"
	OutputYAML  = "yaml"
)

var outputFormats = []string{OutputWide, OutputJSON, OutputYAML}

// newTable writes aligned columns the way kubectl does.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 6, 4, 3, ' ', 0)
}

func row(w io.Writer, cells ...string) {
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// printObject writes a report as JSON or YAML.
func printObject(w io.Writer, v any, format string) error {
	var data []byte
	var err error
	switch format {
	case OutputJSON:
		data, err = json.MarshalIndent(v, "", "  ")
		data = append(data, '\n')
	case OutputYAML:
		data, err = yaml.Marshal(v)
	default:
		return fmt.Errorf("unknown output format %q (supported: %s)", format, strings.Join(outputFormats, ", "))
	}
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

// PrintNodes writes the nodes table: one row per node, then a TOTAL row.
// Wide adds the driver and CUDA versions, device and claim counts, and the
// claims holding each GPU.
func PrintNodes(w io.Writer, list NodeList, wide bool) error {
	tw := newTable(w)
	header := []string{"NODE", "GPUS", "MEMORY", "MIG", "FREE"}
	if wide {
		header = append(header, "DRIVER", "CUDA", "DEVICES", "CLAIMS")
	}
	row(tw, append(header, "HEALTH", "IN USE")...)
	for _, n := range list.Nodes {
		cells := []string{n.Name, formatModels(n.Models), formatBytes(n.Memory), migCapable(n.MIGCapable, n.GPUCount),
			fmt.Sprint(n.Free)}
		if wide {
			cells = append(cells, orDash(n.DriverVersion), orDash(n.CUDADriverVersion), fmt.Sprint(n.Devices), fmt.Sprint(n.Claims))
		}
		var inUse, health []string
		for _, g := range n.GPUs {
			if g.Usage.State != StateFree || (wide && len(g.Usage.Claims) > 0) {
				inUse = append(inUse, g.Name+" "+formatUsage(g.Usage, wide))
			}
			if len(g.Taints) > 0 {
				health = append(health, g.Name+" "+formatTaints(g.Taints))
			}
		}
		row(tw, append(cells, healthText(health), orDash(strings.Join(inUse, "; ")))...)
	}
	t := list.Total
	cells := []string{"TOTAL (" + plural(int64(t.Nodes), "node", "nodes") + ")", formatModels(t.Models), formatBytes(t.Memory),
		fmt.Sprintf("%d/%d", t.MIGCapable, t.GPUs), fmt.Sprint(t.Free)}
	if wide {
		cells = append(cells, "", "", "", "")
	}
	health := "ok"
	if t.Tainted > 0 {
		health = fmt.Sprintf("%d tainted", t.Tainted)
	}
	row(tw, append(cells, health, totalInUse(t))...)
	return tw.Flush()
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

func healthText(tainted []string) string {
	if len(tainted) == 0 {
		return "ok"
	}
	return strings.Join(tainted, "; ")
}

func migCapable(n, of int) string {
	switch n {
	case 0:
		return "no"
	case of:
		return "yes"
	}
	return fmt.Sprintf("%d/%d", n, of)
}

func totalInUse(t Total) string {
	var parts []string
	if t.Whole > 0 {
		parts = append(parts, fmt.Sprintf("%d whole", t.Whole))
	}
	if t.Passthrough > 0 {
		parts = append(parts, fmt.Sprintf("%d passthrough", t.Passthrough))
	}
	if t.MIG > 0 {
		parts = append(parts, fmt.Sprintf("%d mig (%s)", t.MIG, plural(int64(t.MIGDevices), "device", "devices")))
	}
	var shares []string
	if t.TimeSlicing > 0 {
		shares = append(shares, fmt.Sprintf("%d timeslice", t.TimeSlicing))
	}
	if t.MPS > 0 {
		shares = append(shares, fmt.Sprintf("%d mps", t.MPS))
	}
	if len(shares) > 0 {
		parts = append(parts, strings.Join(shares, ", ")+" ("+plural(t.Shares, "share", "shares")+")")
	}
	if len(parts) == 0 {
		return "-"
	}
	return fmt.Sprintf("%d of %d GPUs: %s", t.GPUs-t.Free, t.GPUs, strings.Join(parts, ", "))
}

// PrintNode writes one node: a header, the GPUs' identity, their use and
// devices, the allocations, and the free MIG placements. Wide lists the
// free placements of free GPUs too, and the pods' phases and share IDs.
func PrintNode(w io.Writer, d NodeDetail, wide bool) error {
	var models []ModelCount
	free := 0
	for _, g := range d.GPUs {
		models = addModel(models, g.ProductName, 1)
		if g.Usage.State == StateFree {
			free++
		}
	}
	fmt.Fprintf(w, "Node:     %s\n", d.Name)
	fmt.Fprintf(w, "Driver:   %s", d.Driver)
	if len(d.GPUs) > 0 && d.GPUs[0].DriverVersion != "" {
		fmt.Fprintf(w, " (NVIDIA %s, CUDA %s)", d.GPUs[0].DriverVersion, d.GPUs[0].CUDADriverVersion)
	}
	fmt.Fprintf(w, "\nGPUs:     %s, %d free\nDevices:  %d\n", formatModels(models), free, d.Devices)
	for _, section := range []struct {
		title string
		print func(io.Writer, []GPUDetail, bool)
	}{
		{"Identity", printIdentity},
		{"Use", printUse},
		{"Allocations", printAllocations},
		{"Free MIG placements (profile: first memory slice of each)", printFreeMIG},
	} {
		fmt.Fprintf(w, "\n%s:\n", section.title)
		tw := newTable(w)
		section.print(tw, d.GPUs, wide)
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// The sections of PrintNode; rows are indented under their title.

func printIdentity(tw io.Writer, gpus []GPUDetail, wide bool) {
	header := []string{"  GPU", "PRODUCT", "UUID", "NUMA", "PCI", "NVLINK DOMAIN", "MEMORY", "MIG"}
	if wide {
		header = append(header, "ARCH", "CC", "PCIE ROOT")
	}
	row(tw, header...)
	for _, g := range gpus {
		numa := "-"
		if g.NUMANode != nil {
			numa = fmt.Sprint(*g.NUMANode)
		}
		mig := "no"
		switch {
		case g.MIGEnabled:
			mig = "enabled"
		case g.MIGCapable:
			mig = "capable"
		}
		cells := []string{"  " + g.Name, orDash(g.ProductName), orDash(g.UUID), numa, orDash(g.PCIBusID),
			orDash(g.NVLinkDomain), formatBytes(g.Memory), mig}
		if wide {
			cells = append(cells, orDash(g.Architecture), orDash(g.CUDAComputeCapability), orDash(g.PCIeRoot))
		}
		row(tw, cells...)
	}
}

func printUse(tw io.Writer, gpus []GPUDetail, _ bool) {
	row(tw, "  GPU", "USE", "HEALTH", "DEVICES")
	for _, g := range gpus {
		health := "ok"
		if len(g.Taints) > 0 {
			health = formatTaints(g.Taints)
		}
		row(tw, "  "+g.Name, formatUsage(g.Usage, false), health, deviceNames(g.Devices))
	}
}

func printAllocations(tw io.Writer, gpus []GPUDetail, wide bool) {
	header := []string{"  GPU", "DEVICE", "CLAIM", "REQUEST", "PODS", "CONFIG"}
	if wide {
		header = append(header, "SHARE ID")
	}
	row(tw, header...)
	n := 0
	for _, g := range gpus {
		for _, h := range g.Holders {
			n++
			cells := []string{"  " + g.Name, formatDevice(h.Allocation), h.Namespace + "/" + h.Claim, h.Request,
				formatPods(h.Pods, wide), h.Config.String()}
			if wide {
				cells = append(cells, orDash(h.ShareID))
			}
			row(tw, cells...)
		}
	}
	if n == 0 {
		row(tw, "  -")
	}
}

func printFreeMIG(tw io.Writer, gpus []GPUDetail, wide bool) {
	row(tw, "  GPU", "FREE")
	listed := false
	for _, g := range gpus {
		if len(g.FreeMIG) == 0 && !g.MIGCapable {
			continue
		}
		listed = true
		switch {
		case len(g.FreeMIG) == 0 && len(g.Usage.Passthrough) > 0:
			row(tw, "  "+g.Name, "none (passed through)")
		case len(g.FreeMIG) == 0:
			row(tw, "  "+g.Name, "none")
		case g.Usage.State == StateFree && len(g.Usage.Claims) == 0 && !wide:
			row(tw, "  "+g.Name, "all (GPU free)"+tainted(g.Taints))
		default:
			var parts []string
			for _, f := range g.FreeMIG {
				parts = append(parts, f.Profile+": "+formatPlacements(f.Placements))
			}
			row(tw, "  "+g.Name, strings.Join(parts, "   ")+tainted(g.Taints))
		}
	}
	if !listed {
		row(tw, "  -", "no MIG-capable GPUs")
	}
}

// tainted notes that free placements are tainted: the scheduler allocates
// them only to claims that tolerate the taints.
func tainted(taints []Taint) string {
	if len(taints) == 0 {
		return ""
	}
	return " (tainted: " + formatTaints(taints) + ")"
}

// deviceNames lists a GPU's devices: whole, share and passthrough devices
// by name, MIG devices counted (-o json|yaml lists them all). Those that
// cannot be allocated because the GPU is passed through follow, after
// "unavailable (passthrough):".
func deviceNames(devices []DeviceInfo) string {
	var available, unavailable []DeviceInfo
	for _, d := range devices {
		if d.Unavailable != nil {
			unavailable = append(unavailable, d)
		} else {
			available = append(available, d)
		}
	}
	out := nameDevices(available)
	if len(unavailable) > 0 {
		if out != "" {
			out += "; "
		}
		out += "unavailable (" + unavailable[0].Unavailable.Reason + "): " + nameDevices(unavailable)
	}
	return orDash(out)
}

func nameDevices(devices []DeviceInfo) string {
	var names []string
	mig := 0
	for _, d := range devices {
		if d.Type == vocabulary.KindMIG {
			mig++
			continue
		}
		names = append(names, d.Name)
	}
	if mig > 0 {
		names = append(names, fmt.Sprintf("+%d MIG", mig))
	}
	return strings.Join(names, " ")
}

// PrintClaims writes the claims table; the NAMESPACE column comes with
// all namespaces, wide adds the requested DeviceClasses and pod phases.
func PrintClaims(w io.Writer, list ClaimList, wide bool) error {
	tw := newTable(w)
	var header []string
	if list.Namespace == "" {
		header = append(header, "NAMESPACE")
	}
	header = append(header, "NAME", "STATE", "NODE", "PODS", "DEVICES", "CONFIG")
	if wide {
		header = append(header, "CLASSES")
	}
	row(tw, header...)
	for _, c := range list.Claims {
		var cells []string
		if list.Namespace == "" {
			cells = append(cells, c.Namespace)
		}
		var devices, configs []string
		for _, a := range c.Devices {
			dev := formatDevice(a)
			if wide {
				dev = a.Request + ": " + dev
			}
			devices = append(devices, dev)
			if cfg := a.Config.String(); !slices.Contains(configs, cfg) {
				configs = append(configs, cfg)
			}
		}
		cells = append(cells, c.Name, c.State, orDash(c.Node), formatPods(c.Pods, wide),
			orDash(strings.Join(devices, ", ")), orDash(strings.Join(configs, "; ")))
		if wide {
			cells = append(cells, orDash(strings.Join(c.Classes, ",")))
		}
		row(tw, cells...)
	}
	return tw.Flush()
}
