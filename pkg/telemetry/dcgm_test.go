package telemetry

import (
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry/dcgm"
)

// The dcgm-compatible series are opt-in: without CollectorOptions.DCGM no
// DCGM_FI_* family is exposed.
func TestDCGMOffByDefault(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	c := NewCollector(CollectorOptions{NVML: node.Machine, NodeName: "node-1", GPUs: node.GPUs})
	for name := range scrape(t, Handler(NewRegistry(NewDriverMetrics("node-1"), c))) {
		if strings.HasPrefix(name, "DCGM_") {
			t.Errorf("%s exposed without DCGM", name)
		}
	}
}

// The names, label names and label values dcgm-exporter uses, on a whole
// GPU held by one pod, a time-sliced GPU shared by two, and a free GPU.
func TestDCGMSharedAndWholeGPUs(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	g0, g1, g2 := node.GPUs[0], node.GPUs[1], node.GPUs[2]
	holders := HolderFunc(func() map[string][]Holder {
		return map[string][]Holder{
			g0.UUID: {
				{Device: "gpu-0-ts", Namespace: "team", Claim: "a", Pod: "light", PodUID: "uid-light", Container: "main", ContainerIDs: []string{"c-light"}, Shared: true},
				{Device: "gpu-0-ts", Namespace: "team", Claim: "b", Pod: "heavy", PodUID: "uid-heavy", Container: "main", ContainerIDs: []string{"c-heavy"}, Shared: true},
			},
			g1.UUID: {{Device: "gpu-1", Namespace: "solo", Claim: "w", Pod: "whole", PodUID: "uid-whole", Container: "train", ContainerIDs: []string{"c-whole"}}},
		}
	})
	owners := &fakeOwners{owners: map[uint32]ProcessOwner{
		1001: {PodUID: "uid-light", ContainerID: "c-light"},
		1002: {PodUID: "uid-heavy", ContainerID: "c-heavy"},
		1003: {PodUID: "uid-whole", ContainerID: "c-whole"},
	}}
	registerLoad(t, node.Machine, 1001, nvmlsim.Registration{Devices: []string{g0.UUID}, SMPercent: 20, MemoryBytes: 2 << 30})
	registerLoad(t, node.Machine, 1002, nvmlsim.Registration{Devices: []string{g0.UUID}, SMPercent: 50, MemoryBytes: 8 << 30})
	registerLoad(t, node.Machine, 1003, nvmlsim.Registration{Devices: []string{g1.UUID}, SMPercent: 70, MemoryBytes: 4 << 30})
	dm := NewDriverMetrics("node-1")
	dm.ObserveHealthEvent(health.Event{GPUUUID: g1.UUID, Type: health.EventXID, XID: 62})
	c := NewCollector(CollectorOptions{NVML: node.Machine, NodeName: "node-1", GPUs: node.GPUs, Holders: holders,
		Processes: owners, DCGM: true, XIDs: dm})
	families := scrape(t, Handler(NewRegistry(dm, c)))

	for _, name := range []string{dcgm.GPUUtil, dcgm.MemCopyUtil, dcgm.FBUsed, dcgm.FBFree, dcgm.GPUTemp, dcgm.PowerUsage,
		dcgm.TotalEnergy, dcgm.SMClock, dcgm.MemClock, dcgm.XIDErrors, dcgm.GREngineActive} {
		f := families[name]
		if f == nil {
			t.Errorf("%s missing", name)
			continue
		}
		for _, m := range f.GetMetric() {
			var names []string
			for _, l := range m.GetLabel() {
				names = append(names, l.GetName())
			}
			if want := slices.Sorted(slices.Values(dcgm.Labels)); !slices.Equal(names, want) {
				t.Errorf("%s labels %v, want %v", name, names, want)
			}
		}
	}
	light := map[string]string{"UUID": g0.UUID, "pod": "light", "namespace": "team", "container": "main",
		"gpu": strconv.Itoa(g0.Index), "device": "nvidia" + strconv.Itoa(g0.Minor), "modelName": g0.ProductName,
		"pci_bus_id": g0.PCIBusID, "Hostname": "node-1", "GPU_I_ID": "", "GPU_I_PROFILE": "",
		"dra_claim_name": "a", "dra_claim_namespace": "team", "dra_device_name": "gpu-0-ts"}
	heavy := map[string]string{"UUID": g0.UUID, "pod": "heavy"}
	gpu0 := map[string]string{"UUID": g0.UUID, "pod": ""}
	whole := map[string]string{"UUID": g1.UUID, "pod": "whole", "container": "train", "dra_device_name": "gpu-1"}
	free := map[string]string{"UUID": g2.UUID, "pod": "", "dra_claim_name": ""}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		// A share: its own SM use and memory; the GPU-wide series, without
		// a pod, has the GPU's reading.
		{dcgm.GPUUtil, light, 20},
		{dcgm.GPUUtil, heavy, 50},
		{dcgm.GPUUtil, gpu0, 70},
		{dcgm.GREngineActive, light, 0.20},
		{dcgm.GREngineActive, gpu0, 0.70},
		{dcgm.FBUsed, light, 2048},
		{dcgm.FBUsed, heavy, 8192},
		{dcgm.FBUsed, gpu0, 10240},
		// A whole GPU: the device's readings, with the pod's labels.
		{dcgm.GPUUtil, whole, 70},
		{dcgm.FBUsed, whole, 4096},
		{dcgm.FBFree, whole, float64(g1.MemoryBytes)/mib - 4096},
		{dcgm.XIDErrors, whole, 62},
		{dcgm.XIDErrors, free, 0},
		// A free GPU: the native reading in percent.
		{dcgm.GPUUtil, free, 100 * value(sampleOf(t, families, "gpu_dra_device_utilization_ratio", map[string]string{"uuid": g2.UUID}))},
	} {
		if got := value(sampleOf(t, families, tc.name, tc.labels)); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	// The shared GPU's free memory is the GPU's, on every series.
	for _, m := range series(families, dcgm.FBFree, map[string]string{"UUID": g0.UUID}) {
		if got, want := value(m), float64(g0.MemoryBytes)/mib-10240; got != want {
			t.Errorf("%s%v = %v, want the GPU's %v", dcgm.FBFree, labelsOf(m), got, want)
		}
	}
	// A whole GPU has no series without its pod; a shared one has one.
	if s := series(families, dcgm.GPUUtil, map[string]string{"UUID": g1.UUID, "pod": ""}); len(s) != 0 {
		t.Errorf("whole GPU has a series without its pod: %v", labelsOf(s[0]))
	}
	if n := len(series(families, dcgm.GPUUtil, map[string]string{"UUID": g0.UUID})); n != 3 {
		t.Errorf("shared GPU: %d %s series, want 3 (GPU-wide and one per pod)", n, dcgm.GPUUtil)
	}
	// Neither temperature nor power can be split: every series has the GPU's.
	temps := series(families, dcgm.GPUTemp, map[string]string{"UUID": g0.UUID})
	if len(temps) != 3 || value(temps[0]) != value(temps[1]) || value(temps[1]) != value(temps[2]) {
		t.Errorf("shared GPU temperatures differ or are missing: %v", temps)
	}
}

// MIG devices are labelled as dcgm-exporter labels GPU instances: the
// parent GPU's UUID and index, GPU_I_ID and GPU_I_PROFILE. They have no
// utilization; the engine activity is the instance's GPM SM utilization.
func TestDCGMMIGDevice(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	node, inst := simnode.WithStaticMIG(t, node, 2, 19, mig.Placement{Start: 0, Size: 1})
	g := node.GPUs[2]
	holders := HolderFunc(func() map[string][]Holder {
		return map[string][]Holder{inst.UUID: {{Device: "gpu-2-mig-1g.10gb-0", Namespace: "ns", Claim: "c", Pod: "p", PodUID: "uid-p", Container: "main"}}}
	})
	owners := &fakeOwners{owners: map[uint32]ProcessOwner{2001: {PodUID: "uid-p"}}}
	registerLoad(t, node.Machine, 2001, nvmlsim.Registration{Devices: []string{inst.UUID}, SMPercent: 40, MemoryBytes: 1 << 30})
	c := NewCollector(CollectorOptions{NVML: node.Machine, NodeName: "node-1", GPUs: node.GPUs, Holders: holders, Processes: owners, DCGM: true})
	h := Handler(NewRegistry(nil, c))

	pod := map[string]string{"UUID": g.UUID, "gpu": strconv.Itoa(g.Index), "GPU_I_ID": strconv.Itoa(int(inst.GIID)),
		"GPU_I_PROFILE": "1g.10gb", "pod": "p", "container": "main", "dra_device_name": "gpu-2-mig-1g.10gb-0"}
	first := scrape(t, h)
	if got := value(sampleOf(t, first, dcgm.FBUsed, pod)); got != 1024 {
		t.Errorf("%s on the MIG device: %v MiB, want 1024", dcgm.FBUsed, got)
	}
	if s := series(first, dcgm.GPUUtil, map[string]string{"GPU_I_ID": pod["GPU_I_ID"]}); len(s) != 0 {
		t.Errorf("%s on a MIG device: %v", dcgm.GPUUtil, labelsOf(s[0]))
	}
	// The MIG-enabled GPU itself: temperature, without a pod or instance.
	if got := sampleOf(t, first, dcgm.GPUTemp, map[string]string{"UUID": g.UUID}); labelsOf(got)["GPU_I_ID"] != "" || labelsOf(got)["pod"] != "" {
		t.Errorf("temperature of the MIG-enabled GPU: %v", labelsOf(got))
	}
	time.Sleep(100 * time.Millisecond)
	second := scrape(t, h)
	if got := value(sampleOf(t, second, dcgm.GREngineActive, pod)); got < 0.39 || got > 0.41 {
		t.Errorf("%s on the MIG device: %v, want 0.40", dcgm.GREngineActive, got)
	}
}

// growingNVLink is nvlinkNVML whose counters grow by 1 MiB per read.
type growingNVLink struct {
	nvml.Interface
	reads *atomic.Uint64
}

type growingNVLinkDevice struct {
	nvml.Device
	reads *atomic.Uint64
}

func (n growingNVLink) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	d, ret := n.Interface.DeviceGetHandleByUUID(uuid)
	return growingNVLinkDevice{d, n.reads}, ret
}

func (d growingNVLinkDevice) GetFieldValues(values []nvml.FieldValue) nvml.Return {
	n := d.reads.Add(1)
	for i := range values {
		values[i].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
		binary.NativeEndian.PutUint64(values[i].Value[:], n*1024) // KiB
	}
	return nvml.SUCCESS
}

// NVLink bytes are a rate, as DCGM_FI_PROF_NVLINK_*_BYTES: absent on the
// first scrape, then the counter's growth per second.
func TestDCGMNVLinkRate(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	c := NewCollector(CollectorOptions{NVML: growingNVLink{node.Machine, &atomic.Uint64{}}, NodeName: "node-1", GPUs: node.GPUs[:1], DCGM: true})
	now := time.Unix(1000, 0)
	c.dcgm.now = func() time.Time { return now }
	h := Handler(NewRegistry(nil, c))
	if s := series(scrape(t, h), dcgm.NVLinkTxBytes, nil); len(s) != 0 {
		t.Errorf("NVLink rate on the first scrape: %v", value(s[0]))
	}
	now = now.Add(2 * time.Second)
	// Each scrape reads the native TX and RX counters, then the dcgm ones:
	// 4 reads of 1 MiB each between two dcgm TX readings.
	if got := value(sampleOf(t, scrape(t, h), dcgm.NVLinkTxBytes, nil)); got != 4*mib/2 {
		t.Errorf("%s = %v bytes/s, want %v", dcgm.NVLinkTxBytes, got, 4*mib/2)
	}
}
