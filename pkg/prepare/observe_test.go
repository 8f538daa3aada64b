package prepare

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/health"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/podattribution"
	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry"
)

// The holders of a prepared device name the container of the pod that uses
// the claim, looked up after prepare, until the claim is unprepared.
func TestHoldersNameContainers(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "trainer-0", UID: "pod-uid"},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("c")}},
			Containers: []corev1.Container{
				{Name: "trainer", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}},
				{Name: "logger"},
			},
		},
	}
	d := newTestDriverWith(t, Options{Pods: fake.NewClientset(pod).CoreV1()})
	claim := allocated("c", []string{"gpu-0"})
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if err := prepareOne(t, d, claim); err != nil {
		t.Fatal(err)
	}
	uuid := d.PreparedClaims()[0].Devices[0].UUIDs[0]
	want := []telemetry.Holder{{Device: "gpu-0", Namespace: "ns", Claim: "c", Pod: "trainer-0", Container: "trainer", PodUID: "pod-uid"}}
	deadline := time.Now().Add(10 * time.Second)
	for got := d.Holders()[uuid]; !reflect.DeepEqual(got, want); got = d.Holders()[uuid] {
		if time.Now().After(deadline) {
			t.Fatalf("holders of %s = %+v, want %+v within 10s", uuid, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}

	res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: claim.UID}})
	if err != nil || res[claim.UID] != nil {
		t.Fatalf("unprepare: %v, %v", err, res[claim.UID])
	}
	if got := d.attribution.Consumers(claim.UID); got != nil {
		t.Errorf("consumers after unprepare: %+v", got)
	}
}

// TestHealthDevices: published devices follow their GPU; a prepared dynamic
// MIG device and a static one follow their MIG instance too (the devices
// pkg/health's TestReport reports on).
func TestHealthDevices(t *testing.T) {
	g0 := &discovery.GPU{UUID: "GPU-0", Minor: 0}
	g1 := &discovery.GPU{UUID: "GPU-1", Minor: 1}
	published := []devicemodel.Published{
		{Device: resourceapi.Device{Name: "gpu-0"}, Kind: vocabulary.KindGPU, GPU: g0},
		{Device: resourceapi.Device{Name: "gpu-0-ts"}, Kind: vocabulary.KindTimeSlice, GPU: g0},
		{Device: resourceapi.Device{Name: "gpu-0-mig-1g.10gb-6"}, Kind: vocabulary.KindMIG, GPU: g0},
		{Device: resourceapi.Device{Name: "gpu-0-mig-1g.10gb-5"}, Kind: vocabulary.KindMIG, GPU: g0},
		{Device: resourceapi.Device{Name: "gpu-1-mig-gi2-ci0"}, Kind: vocabulary.KindMIG, GPU: g1,
			StaticMIG: &mig.Instance{GPUUUID: "GPU-1", GIID: 2, CIID: 0}},
	}
	prepared := []checkpoint.PreparedClaim{{Devices: []checkpoint.PreparedDevice{
		{Pool: "node-1", Device: "gpu-0-mig-1g.10gb-6", MIG: &checkpoint.MigInstance{ParentUUID: "GPU-0", GIID: 9, CIID: 0}},
	}}}
	devices := healthDevices("node-1", published, prepared)
	if len(devices) != len(published) {
		t.Fatalf("got %d devices, want %d", len(devices), len(published))
	}
	byName := map[string]health.Device{}
	for _, d := range devices {
		byName[d.Name] = d
	}
	if d := byName["gpu-0-mig-1g.10gb-6"]; d.MIG == nil || d.MIG.GPUInstance != 9 {
		t.Errorf("prepared dynamic MIG device: %+v, want GI 9", d)
	}
	if d := byName["gpu-0-mig-1g.10gb-5"]; d.MIG != nil {
		t.Errorf("unprepared placement has a MIG instance: %+v", d.MIG)
	}
	if d := byName["gpu-1-mig-gi2-ci0"]; d.MIG == nil || d.MIG.GPUInstance != 2 || d.GPUUUID != "GPU-1" {
		t.Errorf("static MIG device: %+v", d)
	}
	if d := byName["gpu-0-ts"]; d.Pool != "node-1" || d.GPUUUID != "GPU-0" || d.MIG != nil {
		t.Errorf("time-slicing share: %+v", d)
	}
}

// TestAllocations: the figures pkg/telemetry's TestDriverMetrics shows.
func TestAllocations(t *testing.T) {
	got := allocations([]checkpoint.PreparedClaim{
		{State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{
			{Kind: vocabulary.KindMIG, GPUUUID: "GPU-0", MIG: &checkpoint.MigInstance{CreatedByDriver: true}},
			{Kind: vocabulary.KindMIG, GPUUUID: "GPU-0", MIG: &checkpoint.MigInstance{CreatedByDriver: false}},
		}},
		{State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{{Kind: vocabulary.KindMPS, GPUUUID: "GPU-1"}}},
		{State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{{Kind: vocabulary.KindMPS, GPUUUID: "GPU-1"}}},
		{State: checkpoint.PrepareStarted, Devices: []checkpoint.PreparedDevice{{Kind: vocabulary.KindGPU, GPUUUID: "GPU-2"}}},
		{State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{{Kind: vocabulary.KindVFIO, GPUUUID: "GPU-3", VFIOPCIBusID: "0000:18:00.0"}}},
	})
	want := telemetry.Allocations{
		Devices:      map[string]int{"gpu": 0, "mig": 2, "timeslice": 0, "mps": 2, "vfio": 1}, // gpu: only started
		MIGInstances: 1, MPSDaemons: 1,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("allocations = %+v, want %+v", got, want)
	}
	if got, want := allocations(nil), (telemetry.Allocations{Devices: map[string]int{"gpu": 0, "mig": 0, "timeslice": 0, "mps": 0, "vfio": 0}}); !reflect.DeepEqual(got, want) {
		t.Errorf("allocations of no claims = %+v, want %+v", got, want)
	}
}

func TestKindOf(t *testing.T) {
	for name, tc := range map[string]struct {
		kinds []vocabulary.Kind
		want  string
	}{
		"none":      {nil, ""},
		"one kind":  {[]vocabulary.Kind{vocabulary.KindMIG, vocabulary.KindMIG}, string(vocabulary.KindMIG)},
		"two kinds": {[]vocabulary.Kind{vocabulary.KindGPU, vocabulary.KindMPS}, telemetry.KindMixed},
	} {
		t.Run(name, func(t *testing.T) {
			var c checkpoint.PreparedClaim
			for _, k := range tc.kinds {
				c.Devices = append(c.Devices, checkpoint.PreparedDevice{Kind: k})
			}
			if got := kindOf(c); got != tc.want {
				t.Errorf("kindOf(%v) = %q, want %q", tc.kinds, got, tc.want)
			}
		})
	}
}

func TestHoldersFromClaims(t *testing.T) {
	claims := []checkpoint.PreparedClaim{
		{UID: "u1", Namespace: "a", Name: "shared", State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{
			{Device: "gpu-0-ts", UUIDs: []string{"GPU-0"}, Sharing: &checkpoint.Sharing{Strategy: "TimeSlicing"}},
		}},
		{UID: "u2", Namespace: "b", Name: "mig", State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{
			{Device: "gpu-1-mig-1g.10gb-6", UUIDs: []string{"MIG-1"}},
		}},
		{UID: "u3", Namespace: "c", Name: "half", State: checkpoint.PrepareStarted, Devices: []checkpoint.PreparedDevice{
			{Device: "gpu-2", UUIDs: []string{"GPU-2"}},
		}},
	}
	pods := map[types.UID][]podattribution.Consumer{"u1": {{Pod: "p1"}, {Pod: "p2", PodUID: "p2-uid", Container: "c", ContainerIDs: []string{"c-id"}}}}
	got := holdersFromClaims(claims, func(uid types.UID) []podattribution.Consumer { return pods[uid] })
	if len(got["GPU-0"]) != 2 || !reflect.DeepEqual(got["GPU-0"][1], telemetry.Holder{Device: "gpu-0-ts", Namespace: "a", Claim: "shared", Pod: "p2", Container: "c",
		PodUID: "p2-uid", ContainerIDs: []string{"c-id"}, Shared: true}) {
		t.Errorf("GPU-0 holders: %+v", got["GPU-0"])
	}
	if h := got["MIG-1"]; len(h) != 1 || !reflect.DeepEqual(h[0], telemetry.Holder{Device: "gpu-1-mig-1g.10gb-6", Namespace: "b", Claim: "mig"}) {
		t.Errorf("MIG-1 holders: %+v", h)
	}
	if _, ok := got["GPU-2"]; ok {
		t.Error("a claim still being prepared has holders")
	}
}

func TestHoldersByRequest(t *testing.T) {
	claim := checkpoint.PreparedClaim{UID: "u", Namespace: "ns", Name: "c", State: checkpoint.PrepareCompleted, Devices: []checkpoint.PreparedDevice{
		{Request: "big", Device: "gpu-0", UUIDs: []string{"GPU-0"}},
		{Request: "small/mig", Device: "gpu-1-mig-1g.10gb-6", UUIDs: []string{"MIG-1"}},
		{Request: "", Device: "gpu-2", UUIDs: []string{"GPU-2"}}, // request unknown
	}}
	holder := func(device, pod, container string) telemetry.Holder {
		return telemetry.Holder{Device: device, Namespace: "ns", Claim: "c", Pod: pod, Container: container}
	}
	type consumer = podattribution.Consumer
	tests := map[string]struct {
		users []consumer
		want  map[string][]telemetry.Holder
	}{
		"pods unknown": {
			want: map[string][]telemetry.Holder{
				"GPU-0": {holder("gpu-0", "", "")}, "MIG-1": {holder("gpu-1-mig-1g.10gb-6", "", "")}, "GPU-2": {holder("gpu-2", "", "")},
			},
		},
		"containers unknown": {
			users: []consumer{{Pod: "p"}},
			want: map[string][]telemetry.Holder{
				"GPU-0": {holder("gpu-0", "p", "")}, "MIG-1": {holder("gpu-1-mig-1g.10gb-6", "p", "")}, "GPU-2": {holder("gpu-2", "p", "")},
			},
		},
		"a container per request, a subrequest matched by its parent": {
			users: []consumer{{Pod: "p", Container: "a", Requests: []string{"big"}}, {Pod: "p", Container: "b", Requests: []string{"small"}}},
			want: map[string][]telemetry.Holder{
				"GPU-0": {holder("gpu-0", "p", "a")},
				"MIG-1": {holder("gpu-1-mig-1g.10gb-6", "p", "b")},
				"GPU-2": {holder("gpu-2", "p", "a"), holder("gpu-2", "p", "b")},
			},
		},
		"a device no container of the pod uses": {
			users: []consumer{{Pod: "p", Container: "a", Requests: []string{"big"}}, {Pod: "q", Container: "c"}},
			want: map[string][]telemetry.Holder{
				"GPU-0": {holder("gpu-0", "p", "a"), holder("gpu-0", "q", "c")},
				"MIG-1": {holder("gpu-1-mig-1g.10gb-6", "q", "c"), holder("gpu-1-mig-1g.10gb-6", "p", "")},
				"GPU-2": {holder("gpu-2", "p", "a"), holder("gpu-2", "q", "c")},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := holdersFromClaims([]checkpoint.PreparedClaim{claim}, func(types.UID) []consumer { return tc.users })
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("holders = %+v, want %+v", got, tc.want)
			}
		})
	}
}
