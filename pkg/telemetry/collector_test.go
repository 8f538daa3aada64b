package telemetry

import (
	"context"
	"encoding/binary"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/passthrough"
)

func TestMain(m *testing.M) { os.Exit(simnode.Main(m)) }

// scrape GETs /metrics from h and parses it.
func scrape(t *testing.T, h http.Handler) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + MetricsPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse scrape: %v", err)
	}
	return families
}

// series returns the samples of family name whose labels include want.
func series(families map[string]*dto.MetricFamily, name string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	f := families[name]
	if f == nil {
		return nil
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			if labels[k] != v {
				match = false
			}
		}
		if match {
			out = append(out, m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return math.NaN()
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// sampleOf returns the single sample of name with labels want.
func sampleOf(t *testing.T, families map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	s := series(families, name, want)
	if len(s) != 1 {
		t.Fatalf("%s%v: %d series, want 1", name, want, len(s))
	}
	return s[0]
}

func TestScrapeDeviceMetricsWithHolders(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	uuid0, uuid1 := node.GPUs[0].UUID, node.GPUs[1].UUID
	holders := HolderFunc(func() map[string][]Holder {
		return map[string][]Holder{uuid0: {
			{Device: "gpu-0-ts", Namespace: "team-a", Claim: "train-gpu", Pod: "trainer-0", Container: "main"},
			{Device: "gpu-0-ts", Namespace: "team-a", Claim: "train-gpu", Pod: "trainer-1", Container: "main"},
			{Device: "gpu-0-ts", Namespace: "team-a", Claim: "train-gpu", Pod: "trainer-1", Container: "main"}, // duplicate
		}}
	})
	c := NewCollector(CollectorOptions{NVML: node.Machine, NodeName: "node-1", GPUs: node.GPUs, Holders: holders})
	h := Handler(NewRegistry(NewDriverMetrics("node-1"), c))

	first := scrape(t, h)
	// Every reading the simulation supports, for every GPU.
	for _, name := range []string{
		"gpu_dra_device_utilization_ratio", "gpu_dra_device_memory_utilization_ratio",
		"gpu_dra_device_memory_used_bytes", "gpu_dra_device_memory_total_bytes",
		"gpu_dra_device_temperature_celsius", "gpu_dra_device_power_watts", "gpu_dra_device_power_limit_watts",
		"gpu_dra_device_energy_joules_total", "gpu_dra_device_sm_clock_hertz", "gpu_dra_device_memory_clock_hertz",
	} {
		if n := len(series(first, name, nil)); n != len(node.GPUs)+1 { // GPU 0 has two holders
			t.Errorf("%s: %d series, want %d", name, n, len(node.GPUs)+1)
		}
	}
	if n := len(series(first, "gpu_dra_device_ecc_volatile_errors_total", map[string]string{"gpu": "gpu-3"})); n != 2 {
		t.Errorf("ECC series of gpu-3: %d, want corrected and uncorrected", n)
	}
	// The simulation has no NVLink counters: left out, not zero.
	if s := series(first, "gpu_dra_device_nvlink_transmit_bytes_total", nil); len(s) != 0 {
		t.Errorf("NVLink throughput reported although NVML does not support it: %v", s)
	}

	// GPU 0 carries its holders' labels, once per pod; GPU 1 none.
	held := series(first, "gpu_dra_device_temperature_celsius", map[string]string{"uuid": uuid0})
	pods := map[string]bool{}
	for _, m := range held {
		l := labelsOf(m)
		if l["device"] != "gpu-0-ts" || l["namespace"] != "team-a" || l["claim"] != "train-gpu" || l["container"] != "main" || l["gpu"] != "gpu-0" || l["node"] != "node-1" {
			t.Errorf("held GPU labels: %v", l)
		}
		pods[l["pod"]] = true
	}
	if len(held) != 2 || !pods["trainer-0"] || !pods["trainer-1"] {
		t.Errorf("held GPU series: %d with pods %v, want trainer-0 and trainer-1", len(held), pods)
	}
	free := sampleOf(t, first, "gpu_dra_device_temperature_celsius", map[string]string{"uuid": uuid1})
	if l := labelsOf(free); l["device"] != "gpu-1" || l["pod"] != "" || l["claim"] != "" {
		t.Errorf("free GPU labels: %v", l)
	}
	total := value(sampleOf(t, first, "gpu_dra_device_memory_total_bytes", map[string]string{"uuid": uuid1}))
	if total != float64(node.GPUs[1].MemoryBytes) {
		t.Errorf("memory total %v, want %d", total, node.GPUs[1].MemoryBytes)
	}
	if v := value(sampleOf(t, first, "gpu_dra_device_up", map[string]string{"uuid": uuid1})); v != 1 {
		t.Errorf("up = %v", v)
	}
	info := sampleOf(t, first, "gpu_dra_device_info", map[string]string{"uuid": uuid1})
	if l := labelsOf(info); l["model"] != node.GPUs[1].ProductName {
		t.Errorf("info labels %v", l)
	}

	// The simulation's readings drift: energy always grows.
	time.Sleep(50 * time.Millisecond)
	second := scrape(t, h)
	e1 := value(sampleOf(t, first, "gpu_dra_device_energy_joules_total", map[string]string{"uuid": uuid1}))
	e2 := value(sampleOf(t, second, "gpu_dra_device_energy_joules_total", map[string]string{"uuid": uuid1}))
	if !(e2 > e1) {
		t.Errorf("energy did not grow between scrapes: %v then %v", e1, e2)
	}
}

func TestScrapeMIGDevices(t *testing.T) {
	node := simnode.New(t, "dgxa100", "node-1")
	dev, _ := node.Machine.DeviceGetHandleByIndex(0)
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatalf("enable MIG: %v", ret)
	}
	giInfo, ret := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	var migUUIDs []string
	for range 2 {
		gi, ret := dev.CreateGpuInstance(&giInfo)
		if ret != nvml.SUCCESS {
			t.Fatalf("create GPU instance: %v", ret)
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
			t.Fatalf("create compute instance: %v", ret)
		}
	}
	for i := range 2 {
		md, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		uuid, _ := md.GetUUID()
		migUUIDs = append(migUUIDs, uuid)
	}
	holders := HolderFunc(func() map[string][]Holder {
		return map[string][]Holder{migUUIDs[0]: {{Device: "gpu-0-mig-1g.5gb-6", Namespace: "ns", Claim: "c", Pod: "p"}}}
	})
	c := NewCollector(CollectorOptions{NVML: node.Machine, NodeName: "node-1", GPUs: node.GPUs, Holders: holders, MIGDeviceName: devicemodel.StaticMIGDeviceName})
	families := scrape(t, Handler(NewRegistry(nil, c)))

	held := sampleOf(t, families, "gpu_dra_device_memory_total_bytes", map[string]string{"uuid": migUUIDs[0]})
	if l := labelsOf(held); l["device"] != "gpu-0-mig-1g.5gb-6" || l["gpu"] != "gpu-0" || l["pod"] != "p" {
		t.Errorf("held MIG device labels: %v", l)
	}
	if v := value(held); v <= 0 || v >= float64(node.GPUs[0].MemoryBytes) {
		t.Errorf("1g MIG device memory: %v bytes", v)
	}
	free := sampleOf(t, families, "gpu_dra_device_memory_total_bytes", map[string]string{"uuid": migUUIDs[1]})
	if l := labelsOf(free); !strings.HasPrefix(l["device"], "gpu-0-mig-gi") || l["pod"] != "" {
		t.Errorf("free MIG device labels: %v", l)
	}
	// MIG devices have no temperature; a MIG-enabled GPU reports no utilization.
	if s := series(families, "gpu_dra_device_temperature_celsius", map[string]string{"uuid": migUUIDs[0]}); len(s) != 0 {
		t.Errorf("temperature reported for a MIG device")
	}
	if s := series(families, "gpu_dra_device_utilization_ratio", map[string]string{"gpu": "gpu-0"}); len(s) != 0 {
		t.Errorf("utilization reported for a MIG-enabled GPU")
	}
	if s := series(families, "gpu_dra_device_temperature_celsius", map[string]string{"uuid": node.GPUs[0].UUID}); len(s) != 1 {
		t.Errorf("MIG-enabled GPU lost its temperature")
	}
}

type fakeHealth health.Snapshot

func (f fakeHealth) Snapshot() health.Snapshot { return health.Snapshot(f) }

func TestScrapeLostAndUnhealthyGPU(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	if err := node.Machine.SetGPULost(1, true); err != nil {
		t.Fatal(err)
	}
	uuid0, uuid1 := node.GPUs[0].UUID, node.GPUs[1].UUID
	hs := fakeHealth{
		uuid0: {UUID: uuid0},
		uuid1: {UUID: uuid1, Lost: true, Unhealthy: &health.Condition{Reason: health.ReasonGPULost}},
	}
	c := NewCollector(CollectorOptions{NVML: node.Machine, NodeName: "node-1", GPUs: node.GPUs, Health: hs})
	families := scrape(t, Handler(NewRegistry(nil, c)))
	if v := value(sampleOf(t, families, "gpu_dra_device_up", map[string]string{"uuid": uuid1})); v != 0 {
		t.Errorf("lost GPU up = %v", v)
	}
	if s := series(families, "gpu_dra_device_power_watts", map[string]string{"uuid": uuid1}); len(s) != 0 {
		t.Errorf("readings of a lost GPU: %v", s)
	}
	if v := value(sampleOf(t, families, "gpu_dra_device_healthy", map[string]string{"uuid": uuid1})); v != 0 {
		t.Errorf("lost GPU healthy = %v", v)
	}
	if v := value(sampleOf(t, families, "gpu_dra_device_healthy", map[string]string{"uuid": uuid0})); v != 1 {
		t.Errorf("healthy GPU healthy = %v", v)
	}
}

// nvlinkNVML answers the NVLink throughput fields the simulation lacks, as
// NVML does: KiB as unsigned long long, per field.
type nvlinkNVML struct{ nvml.Interface }

type nvlinkDevice struct{ nvml.Device }

func (n nvlinkNVML) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	d, ret := n.Interface.DeviceGetHandleByUUID(uuid)
	return nvlinkDevice{d}, ret
}

func (d nvlinkDevice) GetFieldValues(values []nvml.FieldValue) nvml.Return {
	for i := range values {
		v := &values[i]
		if v.ScopeId != math.MaxUint32 {
			v.NvmlReturn = uint32(nvml.ERROR_INVALID_ARGUMENT)
			continue
		}
		v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
		binary.NativeEndian.PutUint64(v.Value[:], uint64(v.FieldId)) // 138 KiB sent, 139 KiB received
	}
	return nvml.SUCCESS
}

func TestNVLinkThroughput(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	c := NewCollector(CollectorOptions{NVML: nvlinkNVML{node.Machine}, NodeName: "node-1", GPUs: node.GPUs[:1]})
	families := scrape(t, Handler(NewRegistry(nil, c)))
	if v := value(sampleOf(t, families, "gpu_dra_device_nvlink_transmit_bytes_total", nil)); v != 138*1024 {
		t.Errorf("transmitted %v bytes, want %d", v, 138*1024)
	}
	if v := value(sampleOf(t, families, "gpu_dra_device_nvlink_receive_bytes_total", nil)); v != 139*1024 {
		t.Errorf("received %v bytes, want %d", v, 139*1024)
	}
}

func TestFieldValue(t *testing.T) {
	mk := func(vt nvml.ValueType, put func(b []byte)) nvml.FieldValue {
		v := nvml.FieldValue{ValueType: uint32(vt)}
		put(v.Value[:])
		return v
	}
	tests := map[string]struct {
		v    nvml.FieldValue
		want float64
		ok   bool
	}{
		"double":    {mk(nvml.VALUE_TYPE_DOUBLE, func(b []byte) { binary.NativeEndian.PutUint64(b, math.Float64bits(1.5)) }), 1.5, true},
		"uint":      {mk(nvml.VALUE_TYPE_UNSIGNED_INT, func(b []byte) { binary.NativeEndian.PutUint32(b, 7) }), 7, true},
		"ulonglong": {mk(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, func(b []byte) { binary.NativeEndian.PutUint64(b, 1<<40) }), 1 << 40, true},
		"int":       {mk(nvml.VALUE_TYPE_SIGNED_INT, func(b []byte) { binary.NativeEndian.PutUint32(b, uint32(0xFFFFFFFF)) }), -1, true},
		"failed":    {nvml.FieldValue{NvmlReturn: uint32(nvml.ERROR_NOT_SUPPORTED)}, 0, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := fieldValue(tc.v)
			if got != tc.want || ok != tc.ok {
				t.Errorf("fieldValue = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// A GPU passed through to a virtual machine (bound to vfio-pci) is not in NVML: it gets no
// readings and no up series (it is not lost), and the others are collected as before.
func TestScrapeSkipsPassedThroughGPU(t *testing.T) {
	node := simnode.New(t, "l4x4", "node-1")
	sys := passthrough.Sysfs{Root: t.TempDir(), Timeout: 5 * time.Second}
	if err := node.Machine.WriteSysfs(sys.Root); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := node.Machine.ServeSysfs(ctx, sys.Root); err != nil {
		t.Fatal(err)
	}
	if err := sys.ToVFIO(ctx, node.GPUs[2].PCIBusID); err != nil {
		t.Fatal(err)
	}
	c := NewCollector(CollectorOptions{NVML: node.Machine, NodeName: "node-1", GPUs: node.GPUs})
	families := scrape(t, Handler(NewRegistry(nil, c)))
	if s := series(families, "gpu_dra_device_up", map[string]string{"uuid": node.GPUs[2].UUID}); len(s) != 0 {
		t.Errorf("passed-through GPU has up series %v", s)
	}
	if s := series(families, "gpu_dra_device_power_watts", map[string]string{"uuid": node.GPUs[2].UUID}); len(s) != 0 {
		t.Errorf("readings of a passed-through GPU: %v", s)
	}
	if v := value(sampleOf(t, families, "gpu_dra_device_up", map[string]string{"uuid": node.GPUs[3].UUID})); v != 1 {
		t.Errorf("GPU 3 up = %v beside a passed-through GPU", v)
	}
}
