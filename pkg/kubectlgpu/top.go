package kubectlgpu

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// PluginSelector selects the driver's kubelet plugin pods (the chart's
// component label).
const PluginSelector = "app.kubernetes.io/component=kubelet-plugin"

// localMetricsFlag is the plugin flag that gives its local metrics port.
const localMetricsFlag = "--local-metrics-address="

// readConcurrency bounds the plugins read at once.
const readConcurrency = 8

// MetricsReader reads the Prometheus text a kubelet plugin pod serves on
// port inside the pod; the command line implements it with the API
// server's pods/portforward.
type MetricsReader interface {
	ReadMetrics(ctx context.Context, pod *corev1.Pod, port int) ([]byte, error)
}

// TopOptions say what `kubectl gpu top` shows.
type TopOptions struct {
	// Node, when set, limits it to one node.
	Node string
	// Namespace limits it to the pods of one namespace; empty means all
	// namespaces, and then processes in no known pod are shown too.
	Namespace string
	// PluginNamespace is where the plugin pods run; empty means any.
	PluginNamespace string
	Reader          MetricsReader
}

// TopRow is one container's use of one device, over the interval since
// the plugin's previous reading.
type TopRow struct {
	Node      string `json:"node"`
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	Claim     string `json:"claim,omitempty"`
	// Device is the DRA device; Kind what it is (gpu, mig, timeslice, mps).
	Device string `json:"device"`
	Kind   string `json:"kind"`
	GPU    string `json:"gpu"`
	UUID   string `json:"uuid"`
	// SMPercent is absent when NVML did not measure it (the first reading
	// of a MIG device, a GPU without GPM).
	SMPercent       *float64 `json:"smPercent,omitempty"`
	MemoryUsedBytes int64    `json:"memoryUsedBytes"`
	// MemoryLimitBytes is the memory limit the plugin reports for the
	// container's share (an MPS share's pinned memory limit, a time-slice
	// share's memory capacity); from a plugin that reports none, the
	// share's memory capacity (its claim's consumed capacity); else the
	// device's memory.
	MemoryLimitBytes int64 `json:"memoryLimitBytes,omitempty"`
	Processes        int   `json:"processes"`
	// limitReported says the plugin reported MemoryLimitBytes.
	limitReported bool
}

// TopList is what `kubectl gpu top -o json` prints.
type TopList struct {
	Kind  string   `json:"kind"`
	Items []TopRow `json:"items"`
}

// RunTop is `kubectl gpu top`: what each container uses of its GPUs, MIG
// devices and shares, read from the plugins' metrics.
func RunTop(ctx context.Context, client kubernetes.Interface, o Options, t TopOptions) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.ErrOut == nil {
		o.ErrOut = io.Discard
	}
	list, warnings, err := Top(ctx, client, t)
	if err != nil {
		return err
	}
	for _, w := range warnings {
		fmt.Fprintf(o.ErrOut, "Warning: %s\n", w)
	}
	if o.structured() {
		return printObject(o.Out, list, o.Output)
	}
	if len(list.Items) == 0 {
		fmt.Fprintln(o.ErrOut, "No processes on the driver's GPUs.")
		return nil
	}
	return PrintTop(o.Out, list, o.Output == OutputWide)
}

// Top reads every plugin pod (of t.Node) and returns the rows t selects;
// a plugin that cannot be read is a warning.
func Top(ctx context.Context, client kubernetes.Interface, t TopOptions) (*TopList, []string, error) {
	opts := metav1.ListOptions{LabelSelector: PluginSelector}
	if t.Node != "" {
		opts.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", t.Node).String()
	}
	pods, err := client.CoreV1().Pods(t.PluginNamespace).List(ctx, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("list the kubelet plugin pods (pods, label %s): %w", PluginSelector, err)
	}
	if len(pods.Items) == 0 {
		return nil, nil, fmt.Errorf("no kubelet plugin pods (label %s)%s", PluginSelector, onNode(t.Node))
	}
	var (
		mu       sync.Mutex
		rows     []TopRow
		warnings []string
		wg       sync.WaitGroup
		sem      = make(chan struct{}, readConcurrency)
	)
	for i := range pods.Items {
		pod := &pods.Items[i]
		port, ok := localMetricsPort(pod)
		if !ok || pod.Status.Phase != corev1.PodRunning {
			mu.Lock()
			warnings = append(warnings, fmt.Sprintf("plugin pod %s/%s on %s: not running or serves no local metrics (chart value kubeletPlugin.localMetricsPort)", pod.Namespace, pod.Name, pod.Spec.NodeName))
			mu.Unlock()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			text, err := t.Reader.ReadMetrics(ctx, pod, port)
			var got []TopRow
			if err == nil {
				got, err = ParseTop(text)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				warnings = append(warnings, fmt.Sprintf("plugin pod %s/%s on %s: %v", pod.Namespace, pod.Name, pod.Spec.NodeName, err))
				return
			}
			rows = append(rows, got...)
		}()
	}
	wg.Wait()
	if w := shareLimits(ctx, client, t.Namespace, rows); w != "" {
		warnings = append(warnings, w)
	}
	list := &TopList{Kind: "GPUTop", Items: []TopRow{}}
	for _, r := range rows {
		if (t.Namespace == "" || r.Namespace == t.Namespace) && (t.Node == "" || r.Node == t.Node) {
			list.Items = append(list.Items, r)
		}
	}
	slices.SortFunc(list.Items, func(a, b TopRow) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod),
			cmp.Compare(a.Container, b.Container), cmp.Compare(a.Device, b.Device), cmp.Compare(a.UUID, b.UUID))
	})
	slices.Sort(warnings)
	return list, warnings, nil
}

func onNode(node string) string {
	if node == "" {
		return ""
	}
	return " on node " + node
}

// localMetricsPort is the port of the plugin's --local-metrics-address.
func localMetricsPort(pod *corev1.Pod) (int, bool) {
	for _, c := range pod.Spec.Containers {
		for _, arg := range slices.Concat(c.Command, c.Args) {
			if addr, ok := strings.CutPrefix(arg, localMetricsFlag); ok {
				i := strings.LastIndex(addr, ":")
				if port, err := strconv.Atoi(addr[i+1:]); err == nil && port > 0 && port < 65536 {
					return port, true
				}
			}
		}
	}
	return 0, false
}

// shareLimits sets the limit of rows on shares whose plugin reports no
// limit (an older release) to the share's memory: the capacity its
// claim's allocation consumed (an MPS share's pinned memory limit derives
// from it unless its config sets one). Claims that cannot be listed leave
// the device's memory, with a warning.
func shareLimits(ctx context.Context, client kubernetes.Interface, namespace string, rows []TopRow) string {
	unreported := func(r TopRow) bool { return r.Claim != "" && !r.limitReported }
	if !slices.ContainsFunc(rows, unreported) {
		return ""
	}
	claims, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Sprintf("memory limits of shares are the devices' memory: cannot list resourceclaims: %v", err)
	}
	memory := map[string]int64{} // namespace/claim/device
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if q, ok := res.ConsumedCapacity[vocabulary.CapacityMemory]; ok && q.Value() > 0 {
				memory[c.Namespace+"/"+c.Name+"/"+res.Device] = q.Value()
			}
		}
	}
	for i := range rows {
		if !unreported(rows[i]) {
			continue
		}
		if m, ok := memory[rows[i].Namespace+"/"+rows[i].Claim+"/"+rows[i].Device]; ok {
			rows[i].MemoryLimitBytes = m
		}
	}
	return ""
}

// Metric names ParseTop reads (pkg/telemetry, docs/telemetry.md).
const (
	metricContainerSM        = "gpu_dra_container_sm_utilization_ratio"
	metricContainerMemory    = "gpu_dra_container_memory_used_bytes"
	metricContainerProcesses = "gpu_dra_container_processes"
	metricContainerLimit     = "gpu_dra_container_memory_limit_bytes"
	metricDeviceMemoryTotal  = "gpu_dra_device_memory_total_bytes"
)

// ParseTop turns a plugin's metrics into rows: one per container and
// device; the limit is the one the plugin reports for the container's
// share, else the device's memory (Top narrows that for shares).
func ParseTop(text []byte) ([]TopRow, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(string(text)))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	totals := map[string]int64{}
	for _, m := range families[metricDeviceMemoryTotal].GetMetric() {
		totals[label(m, "uuid")] = int64(m.GetGauge().GetValue())
	}
	rows := map[string]*TopRow{}
	row := func(m *dto.Metric) *TopRow {
		key := strings.Join([]string{label(m, "uuid"), label(m, "namespace"), label(m, "pod"), label(m, "container"), label(m, "claim"), label(m, "device")}, "\x00")
		r := rows[key]
		if r == nil {
			r = &TopRow{Node: label(m, "node"), Namespace: label(m, "namespace"), Pod: label(m, "pod"), Container: label(m, "container"),
				Claim: label(m, "claim"), Device: label(m, "device"), GPU: label(m, "gpu"), UUID: label(m, "uuid")}
			r.Kind = deviceKindOf(r.UUID, r.Device)
			r.MemoryLimitBytes = totals[r.UUID]
			rows[key] = r
		}
		return r
	}
	for _, m := range families[metricContainerProcesses].GetMetric() {
		row(m).Processes = int(m.GetGauge().GetValue())
	}
	for _, m := range families[metricContainerMemory].GetMetric() {
		row(m).MemoryUsedBytes = int64(m.GetGauge().GetValue())
	}
	for _, m := range families[metricContainerLimit].GetMetric() {
		r := row(m)
		r.MemoryLimitBytes, r.limitReported = int64(m.GetGauge().GetValue()), true
	}
	for _, m := range families[metricContainerSM].GetMetric() {
		v := m.GetGauge().GetValue() * 100
		row(m).SMPercent = &v
	}
	out := make([]TopRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// deviceKindOf tells the kind from the device label, as the device model
// names devices: MIG devices by their MIG- UUID, shares by their "-ts" and
// "-mps" suffixes.
func deviceKindOf(uuid, device string) string {
	switch {
	case strings.HasPrefix(uuid, "MIG-") && strings.HasSuffix(device, "-mps"):
		return "mig+mps"
	case strings.HasPrefix(uuid, "MIG-"):
		return "mig"
	case strings.HasSuffix(device, "-ts"):
		return "timeslice"
	case strings.HasSuffix(device, "-mps"):
		return "mps"
	}
	return "gpu"
}

// PrintTop prints the rows as a table; wide adds the claim, GPU, UUID and
// process count.
func PrintTop(w io.Writer, list *TopList, wide bool) error {
	tw := newTable(w)
	header := "NODE\tNAMESPACE\tPOD\tCONTAINER\tDEVICE\tKIND\tSM\tMEMORY"
	if wide {
		header += "\tCLAIM\tGPU\tUUID\tPROCESSES"
	}
	fmt.Fprintln(tw, header)
	for _, r := range list.Items {
		sm := "-"
		if r.SMPercent != nil {
			sm = strconv.FormatFloat(*r.SMPercent, 'f', 0, 64) + "%"
		}
		used := "0"
		if r.MemoryUsedBytes > 0 {
			used = formatBytes(*resource.NewQuantity(r.MemoryUsedBytes, resource.BinarySI))
		}
		memory := used + "/" + formatBytes(*resource.NewQuantity(r.MemoryLimitBytes, resource.BinarySI))
		line := strings.Join([]string{r.Node, orNone(r.Namespace), orNone(r.Pod), orNone(r.Container), r.Device, r.Kind, sm, memory}, "\t")
		if wide {
			line += "\t" + strings.Join([]string{orNone(r.Claim), r.GPU, r.UUID, strconv.Itoa(r.Processes)}, "\t")
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
