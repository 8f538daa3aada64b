package clusternodes

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-dra/gpu-dra-driver/internal/standin/apiserver"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// TestFollow: a followed node publishes the printed slices; a claim
// allocated on it withdraws what the claim's GPU can no longer give (its
// MIG placements and shares, not the GPU itself), a claim of another node
// or driver changes nothing, and the devices come back once the claim is
// deallocated, then once it is deleted.
func TestFollow(t *testing.T) {
	const node = "node-1"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, printed, f := followDGX(t, ctx, node, devicemodel.ReservePolicy{})
	stored := func() []string { return storedDevices(f, node) }
	all, ofGPU0 := 0, 0 // devices, those carved from gpu-0
	for _, s := range printed {
		all += len(s.Spec.Devices)
		for _, d := range s.Spec.Devices {
			if strings.HasPrefix(d.Name, "gpu-0-") {
				ofGPU0++
			}
		}
	}
	waitFor := func(what string, ok func(names []string) bool) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return f.Published() && ok(stored()), nil
		})
		if err != nil {
			t.Fatalf("%s: stored devices %v", what, stored())
		}
	}
	waitFor("first publication", func(names []string) bool { return len(names) == all })

	claims := client.ResourceV1().ResourceClaims("ns")
	allocated := func(name, driver, pool, device string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: driver, Pool: pool, Device: device}},
			}}},
		}
	}
	for _, c := range []*resourceapi.ResourceClaim{
		allocated("elsewhere", "gpu.dra.dev", "node-2", "gpu-1"),
		allocated("other-driver", "other.dra.dev", node, "gpu-2"),
		allocated("mine", "gpu.dra.dev", node, "gpu-0"),
	} {
		if _, err := claims.Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	withdrawn := func(names []string) bool {
		return slices.Contains(names, "gpu-0") && !slices.Contains(names, "gpu-0-ts") && !slices.Contains(names, "gpu-0-mig-1g10gb-0") &&
			slices.Contains(names, "gpu-1-ts") && slices.Contains(names, "gpu-2-mig-1g10gb-0")
	}
	waitFor("claim allocated gpu-0", withdrawn)
	if n := len(stored()); n != all-ofGPU0 || ofGPU0 == 0 {
		t.Errorf("%d devices stored with gpu-0 held, want %d (all but the %d devices carved from gpu-0)", n, all-ofGPU0, ofGPU0)
	}

	mine, err := claims.Get(ctx, "mine", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mine.Status.Allocation = nil
	if _, err := claims.UpdateStatus(ctx, mine, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("claim deallocated", func(names []string) bool { return len(names) == all })

	mine = allocated("mine", "gpu.dra.dev", node, "gpu-0")
	if _, err := claims.UpdateStatus(ctx, mine, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("claim allocated again", withdrawn)
	if err := claims.Delete(ctx, "mine", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("claim deleted", func(names []string) bool { return len(names) == all })
	if f.Publications() < 4 {
		t.Errorf("%d publications after the first, want at least one per change (4)", f.Publications())
	}
}

// TestFollowReserve: with the reserve policy (K=1, hold 1 s) a followed
// node publishes everything until the hold after its first publication,
// then its whole GPUs and only the spare's MIG placements and shares; a
// claim on the spare moves the spare to the next free GPU, as the
// plugin's tracker does.
func TestFollowReserve(t *testing.T) {
	const node = "node-1"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, printed, f := followDGX(t, ctx, node, devicemodel.ReservePolicy{SpareGPUs: 1, HoldSeconds: 1})
	carved := func(names []string, gpu string) (n int) {
		for _, name := range names {
			if strings.HasPrefix(name, gpu+"-") {
				n++
			}
		}
		return n
	}
	stored := func() []string { return storedDevices(f, node) }
	waitFor := func(what string, ok func(names []string) bool) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return f.Published() && ok(stored()), nil
		})
		if err != nil {
			t.Fatalf("%s: stored devices %v", what, stored())
		}
	}
	var all []string
	for _, s := range printed {
		for _, d := range s.Spec.Devices {
			all = append(all, d.Name)
		}
	}
	onlySpare := func(spare string) func([]string) bool {
		return func(names []string) bool {
			for g := range 8 {
				gpu := fmt.Sprintf("gpu-%d", g)
				if !slices.Contains(names, gpu) {
					return false // a whole GPU is always published
				}
				want := 0
				if gpu == spare {
					want = carved(all, gpu)
				}
				if carved(names, gpu) != want {
					return false
				}
			}
			return true
		}
	}
	waitFor("hold after the first publication ended", onlySpare("gpu-7"))

	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: "ns", UID: "uid-mine"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.dra.dev", Pool: node, Device: "gpu-7"}},
		}}},
	}
	if _, err := client.ResourceV1().ResourceClaims("ns").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("spare moved to gpu-6 once gpu-7 is held", onlySpare("gpu-6"))
}

// followDGX follows one node publishing the printed DGX H100 slices under
// policy, stopped when the test ends.
func followDGX(t *testing.T, ctx context.Context, node string, policy devicemodel.ReservePolicy) (kubernetes.Interface, []*resourceapi.ResourceSlice, *Followers) {
	t.Helper()
	data, err := os.ReadFile("../../../pkg/nodeplugin/testdata/slices/dgxh100.yaml")
	if err != nil {
		t.Fatal(err)
	}
	printed, err := parseSlices(data)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Resources(printed)
	if err != nil {
		t.Fatal(err)
	}
	client := apiserver.NodeClient(node)
	f, err := Follow(ctx, client, "gpu.dra.dev", map[string]resourceslice.DriverResources{node: res}, policy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	return client, printed, f
}

// storedDevices names the devices stored in node's slices now.
func storedDevices(f *Followers, node string) []string {
	var names []string
	for _, s := range f.nodes[node].stored.Slices(node) {
		for _, d := range s.Spec.Devices {
			names = append(names, d.Name)
		}
	}
	return names
}
