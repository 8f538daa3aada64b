package coexistence

import (
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// slice is a ResourceSlice of driver on nodeName with n devices, written by
// the field managers (as the API server records them).
func slice(name, driver, nodeName string, n int, managers ...string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: driver, NodeName: ptr.To(nodeName),
			Pool: resourceapi.ResourcePool{Name: nodeName, ResourceSliceCount: 1},
		},
	}
	for i := range n {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: "gpu-" + string(rune('0'+i))})
	}
	for _, m := range managers {
		s.ManagedFields = append(s.ManagedFields, metav1.ManagedFieldsEntry{Manager: m, Operation: metav1.ManagedFieldsOperationUpdate})
	}
	return s
}

const nvidiaManager = "gpu-kubelet-plugin" // k8s-dra-driver-gpu's kubelet plugin

func TestDRADriverConflicts(t *testing.T) {
	for name, tc := range map[string]struct {
		slices []*resourceapi.ResourceSlice
		want   []string
	}{
		"none": {},
		"NVIDIA's plugin's slice": {slices: []*resourceapi.ResourceSlice{slice("n-b", vocabulary.NVIDIADriverName, "node-1", 8, nvidiaManager)},
			want: []string{"ResourceSlice n-b (8 devices)"}},
		"ours under the compat profile": {slices: []*resourceapi.ResourceSlice{slice("n-a", vocabulary.NVIDIADriverName, "node-1", 8, vocabulary.KubeletPluginAgent)}},
		"ours, later touched by someone else": {slices: []*resourceapi.ResourceSlice{
			slice("n-a", vocabulary.NVIDIADriverName, "node-1", 2, vocabulary.KubeletPluginAgent, "kubectl-edit")}},
		"no field manager recorded: not ours": {slices: []*resourceapi.ResourceSlice{slice("n-c", vocabulary.NVIDIADriverName, "node-1", 0)},
			want: []string{"ResourceSlice n-c (0 devices)"}},
		"theirs beside ours, sorted": {
			slices: []*resourceapi.ResourceSlice{
				slice("n-z", vocabulary.NVIDIADriverName, "node-1", 1, nvidiaManager),
				slice("n-a", vocabulary.NVIDIADriverName, "node-1", 8, vocabulary.KubeletPluginAgent),
				slice("n-b", vocabulary.NVIDIADriverName, "node-1", 2, nvidiaManager),
			},
			want: []string{"ResourceSlice n-b (2 devices)", "ResourceSlice n-z (1 devices)"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var list []resourceapi.ResourceSlice
			for _, s := range tc.slices {
				list = append(list, *s)
			}
			if got := DRADriverConflicts(list); !slices.Equal(got, tc.want) {
				t.Errorf("DRADriverConflicts = %q, want %q", got, tc.want)
			}
		})
	}
}

// The Gate treats ResourceSlices of NVIDIA's DRA driver on its node as it
// treats a device plugin: it withdraws, records an event and publishes again
// when they are gone. Under NVIDIA's driver name it tells its own slices by
// their field manager, and before anything was published it never starts
// the slice controller (which would delete NVIDIA's slices): it deletes only
// its own stale slices.
func TestGateNVIDIADRADriver(t *testing.T) {
	theirs := slice("node-1-gpu.nvidia.com-abcde", vocabulary.NVIDIADriverName, "node-1", 8, nvidiaManager)
	stale := slice("node-1-gpu.nvidia.com-old", vocabulary.NVIDIADriverName, "node-1", 8, vocabulary.KubeletPluginAgent)
	elsewhere := slice("node-2-gpu.nvidia.com-xyz", vocabulary.NVIDIADriverName, "node-2", 8, nvidiaManager)
	otherDriver := slice("node-1-example.com-xyz", "example.com", "node-1", 8, nvidiaManager)
	for name, tc := range map[string]struct {
		driver       string
		slices       []*resourceapi.ResourceSlice
		wantPubs     []int // before NVIDIA's slice is deleted, and after
		wantPubsGone []int
		wantEvents   []string
		wantLeft     []string // slices left after the first check
	}{
		"own driver name: withdraws through the target": {
			driver: vocabulary.DriverName, slices: []*resourceapi.ResourceSlice{theirs},
			wantPubs: []int{0}, wantPubsGone: []int{0, 1},
			wantEvents: []string{ReasonDRAConflict, ReasonDRAResolved}, wantLeft: []string{theirs.Name},
		},
		"compat: own stale slice deleted, NVIDIA's kept, target untouched": {
			driver: vocabulary.NVIDIADriverName, slices: []*resourceapi.ResourceSlice{theirs, stale},
			wantPubsGone: []int{1},
			wantEvents:   []string{ReasonDRAConflict, ReasonDRAResolved}, wantLeft: []string{theirs.Name},
		},
		"compat: own slices only, no conflict": {
			driver: vocabulary.NVIDIADriverName, slices: []*resourceapi.ResourceSlice{stale},
			wantPubs: []int{1}, wantPubsGone: []int{1}, wantLeft: []string{stale.Name},
		},
		"other node and other driver: no conflict": {
			driver: vocabulary.DriverName, slices: []*resourceapi.ResourceSlice{elsewhere, otherDriver},
			wantPubs: []int{1}, wantPubsGone: []int{1}, wantLeft: []string{otherDriver.Name, elsewhere.Name},
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			client := fake.NewClientset(node(nil))
			apiserver.GenerateNames(client)
			for _, s := range tc.slices {
				// The tracker, not Create: the fake's field manager would
				// replace the managedFields the API server recorded.
				if err := client.Tracker().Add(s.DeepCopy()); err != nil {
					t.Fatal(err)
				}
			}
			target := &recorder{}
			g := New(Options{Client: client, NodeName: "node-1", DriverName: tc.driver, Target: target, Period: time.Hour})
			if err := g.PublishResources(ctx, devices); err != nil {
				t.Fatal(err)
			}
			g.check(ctx)
			g.check(ctx) // nothing new
			if got := target.published(); !slices.Equal(got, tc.wantPubs) {
				t.Errorf("publications %v, want %v", got, tc.wantPubs)
			}
			if got := sliceNames(t, client); !slices.Equal(got, tc.wantLeft) {
				t.Errorf("slices left %q, want %q", got, tc.wantLeft)
			}
			if err := client.ResourceV1().ResourceSlices().Delete(ctx, theirs.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			g.check(ctx)
			if got := target.published(); !slices.Equal(got, tc.wantPubsGone) {
				t.Errorf("after NVIDIA's slice is gone: publications %v, want %v", got, tc.wantPubsGone)
			}
			if got := eventReasons(t, ctx, client); !slices.Equal(got, tc.wantEvents) {
				t.Errorf("events %v, want %v", got, tc.wantEvents)
			}
			if got := g.Conflicts(); len(got) != 0 {
				t.Errorf("Conflicts() = %v at the end, want none", got)
			}
		})
	}
}

func sliceNames(t *testing.T, client *fake.Clientset) []string {
	t.Helper()
	list, err := client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range list.Items {
		out = append(out, s.Name)
	}
	slices.Sort(out)
	return out
}
