package telemetry

import (
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// fakeOwners is the cgroup lookup of a node whose processes run in pods.
type fakeOwners struct {
	mu     sync.Mutex
	owners map[uint32]ProcessOwner
	kept   map[uint32]bool
}

func (f *fakeOwners) Owner(pid uint32) (ProcessOwner, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.owners[pid]
	return o, ok
}

func (f *fakeOwners) Keep(pids map[uint32]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kept = pids
}

func registerLoad(t *testing.T, m *nvmlsim.Machine, pid uint32, reg nvmlsim.Registration) func() {
	t.Helper()
	stop, err := m.RegisterProcess(pid, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return stop
}

// Two time-sliced pods with different loads on one GPU: each container's
// reading is its own, while the GPU-wide reading (the same for every
// holder) is their sum. A process in no known pod is reported without
// holder labels; a stopped load drops its container to zero.
func TestScrapeContainersOnSharedGPU(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	uuid := node.GPUs[0].UUID
	holders := HolderFunc(func() map[string][]Holder {
		return map[string][]Holder{uuid: {
			{Device: "gpu-0-ts", Namespace: "team", Claim: "a", Pod: "light", PodUID: "uid-light", Container: "main", ContainerIDs: []string{"c-light"}},
			{Device: "gpu-0-ts", Namespace: "team", Claim: "b", Pod: "heavy", PodUID: "uid-heavy", Container: "main", ContainerIDs: []string{"c-heavy"}},
			{Device: "gpu-0-ts", Namespace: "team", Claim: "c", Pod: "idle", PodUID: "uid-idle", Container: "main"},
		}}
	})
	owners := &fakeOwners{owners: map[uint32]ProcessOwner{
		1001: {PodUID: "uid-light", ContainerID: "c-light"},
		1002: {PodUID: "uid-heavy", ContainerID: "c-heavy"},
		1003: {PodUID: "uid-heavy", ContainerID: "c-heavy"},
	}}
	registerLoad(t, node.Machine, 1001, nvmlsim.Registration{Devices: []string{uuid}, SMPercent: 20, MemoryBytes: 2 << 30})
	stopHeavy := registerLoad(t, node.Machine, 1002, nvmlsim.Registration{Devices: []string{uuid}, SMPercent: 50, MemoryBytes: 8 << 30})
	registerLoad(t, node.Machine, 1003, nvmlsim.Registration{Devices: []string{uuid}, SMPercent: 10, MemoryBytes: 1 << 30, MPS: true})
	registerLoad(t, node.Machine, 1004, nvmlsim.Registration{Devices: []string{uuid}, SMPercent: 5})
	c := NewCollector(CollectorOptions{NVML: node.Machine, NodeName: "node-1", GPUs: node.GPUs, Holders: holders, Processes: owners})
	h := Handler(NewRegistry(nil, c))

	families := scrape(t, h)
	light := map[string]string{"uuid": uuid, "pod": "light", "container": "main", "claim": "a", "device": "gpu-0-ts", "namespace": "team", "gpu": "gpu-0", "node": "node-1"}
	heavy := map[string]string{"uuid": uuid, "pod": "heavy", "container": "main", "claim": "b"}
	nobody := map[string]string{"uuid": uuid, "pod": "", "container": "", "device": "gpu-0"}
	idle := map[string]string{"uuid": uuid, "pod": "idle", "container": "main", "claim": "c"}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"gpu_dra_container_sm_utilization_ratio", light, 0.20},
		{"gpu_dra_container_sm_utilization_ratio", heavy, 0.60}, // with its MPS client
		{"gpu_dra_container_sm_utilization_ratio", nobody, 0.05},
		{"gpu_dra_container_memory_utilization_ratio", light, 0.10},
		{"gpu_dra_container_memory_used_bytes", light, 2 << 30},
		{"gpu_dra_container_memory_used_bytes", heavy, 9 << 30},
		{"gpu_dra_container_processes", heavy, 2},
		{"gpu_dra_container_processes", nobody, 1},
		{"gpu_dra_container_processes", idle, 0},
		{"gpu_dra_container_sm_utilization_ratio", idle, 0},
		{"gpu_dra_container_memory_used_bytes", idle, 0},
	} {
		if got := value(sampleOf(t, families, tc.name, tc.labels)); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
	for _, m := range series(families, "gpu_dra_device_utilization_ratio", map[string]string{"uuid": uuid}) {
		if got := value(m); got != 0.85 {
			t.Errorf("GPU-wide utilization for %v = %v, want 0.85 (the sum)", labelsOf(m), got)
		}
	}
	if want := map[uint32]bool{1001: true, 1002: true, 1003: true, 1004: true}; !reflect.DeepEqual(owners.kept, want) {
		t.Errorf("PIDs kept %v, want %v", owners.kept, want)
	}

	stopHeavy()
	time.Sleep(time.Millisecond) // the next samples are newer
	families = scrape(t, h)
	if got := value(sampleOf(t, families, "gpu_dra_container_sm_utilization_ratio", heavy)); got != 0.10 {
		t.Errorf("heavy pod after its main load stopped: %v, want 0.10 (its MPS client)", got)
	}
	if got := value(sampleOf(t, families, "gpu_dra_container_sm_utilization_ratio", light)); got != 0.20 {
		t.Errorf("light pod after its neighbour stopped: %v, want 0.20", got)
	}
}

// On MIG devices NVML samples no process: the container's SM reading is its
// GPU instance's GPM SM utilization since the previous scrape, absent on the
// first scrape.
func TestScrapeContainersOnMIGDevice(t *testing.T) {
	node := simnode.New(t, "dgxh100", "node-1")
	node, inst := simnode.WithStaticMIG(t, node, 2, 19, mig.Placement{Start: 0, Size: 1})
	migUUID := inst.UUID
	if migUUID == "" {
		t.Fatalf("no MIG device after creating %+v", inst)
	}
	holders := HolderFunc(func() map[string][]Holder {
		return map[string][]Holder{migUUID: {{Device: "gpu-2-mig-gi13-ci0", Namespace: "ns", Claim: "c", Pod: "p", PodUID: "uid-p", Container: "main"}}}
	})
	owners := &fakeOwners{owners: map[uint32]ProcessOwner{2001: {PodUID: "uid-p", ContainerID: "not-yet-known"}}}
	registerLoad(t, node.Machine, 2001, nvmlsim.Registration{Devices: []string{migUUID}, SMPercent: 40, MemoryBytes: 1 << 30})
	c := NewCollector(CollectorOptions{NVML: node.Machine, NodeName: "node-1", GPUs: node.GPUs, Holders: holders, Processes: owners})
	h := Handler(NewRegistry(nil, c))

	pod := map[string]string{"uuid": migUUID, "pod": "p", "container": "main"}
	first := scrape(t, h)
	if got := value(sampleOf(t, first, "gpu_dra_container_memory_used_bytes", pod)); got != 1<<30 {
		t.Errorf("memory on the MIG device: %v", got)
	}
	if s := series(first, "gpu_dra_container_sm_utilization_ratio", pod); len(s) != 0 {
		t.Errorf("SM utilization on the first scrape, with no interval yet: %v", s)
	}
	time.Sleep(100 * time.Millisecond)
	second := scrape(t, h)
	if got := value(sampleOf(t, second, "gpu_dra_container_sm_utilization_ratio", pod)); got < 0.39 || got > 0.41 {
		t.Errorf("SM utilization on the MIG device: %v, want 0.40", got)
	}
	if s := series(second, "gpu_dra_container_memory_utilization_ratio", pod); len(s) != 0 {
		t.Errorf("memory utilization on a MIG device, which NVML does not sample: %v", s)
	}
}

func TestHolderOf(t *testing.T) {
	a := Holder{Pod: "p", PodUID: "uid", Container: "a", ContainerIDs: []string{"id-a", "id-a-old"}}
	b := Holder{Pod: "p", PodUID: "uid", Container: "b", ContainerIDs: []string{"id-b"}}
	other := Holder{Pod: "q", PodUID: "uid-q", Container: "x"}
	tests := map[string]struct {
		owner   ProcessOwner
		known   bool
		holders []Holder
		want    Holder
	}{
		"by container ID":                  {ProcessOwner{"uid", "id-b"}, true, []Holder{a, b, other}, b},
		"by an earlier container ID":       {ProcessOwner{"uid", "id-a-old"}, true, []Holder{a, b}, a},
		"the pod's only container":         {ProcessOwner{"uid", "new-id"}, true, []Holder{a, other}, a},
		"two containers, ID not yet known": {ProcessOwner{"uid", "new-id"}, true, []Holder{a, b}, Holder{Pod: "p", PodUID: "uid"}},
		"a pod holding no claim on it":     {ProcessOwner{"uid-z", "z"}, true, []Holder{a, other}, Holder{}},
		"no pod":                           {ProcessOwner{}, false, []Holder{a}, Holder{}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			owners := &fakeOwners{owners: map[uint32]ProcessOwner{}}
			if tc.known {
				owners.owners[7] = tc.owner
			}
			c := NewCollector(CollectorOptions{Processes: owners})
			if got := c.holderOf(7, tc.holders); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("holderOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}
