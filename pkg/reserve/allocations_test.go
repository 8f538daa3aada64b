package reserve_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/reserve"
)

func allocatedClaim(name string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)}}
	if len(results) > 0 {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	return c
}

func result(driver, pool, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: driver, Pool: pool, Device: device}
}

// TestWatchAllocations: the informer follows the devices of its pool that
// allocated claims hold (not other drivers' or pools', not admin access),
// through allocation, deallocation and deletion, and signals each change.
func TestWatchAllocations(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	admin := result("gpu.dra.dev", "node-1", "gpu-2")
	admin.AdminAccess = ptr.To(true)
	client := fake.NewClientset(
		allocatedClaim("a", result("gpu.dra.dev", "node-1", "gpu-0-mig-1g10gb-6"), result("gpu.dra.dev", "node-2", "gpu-1")),
		allocatedClaim("other-driver", result("other.dev", "node-1", "gpu-3")),
		allocatedClaim("admin", admin),
		allocatedClaim("pending"),
	)
	a := reserve.WatchAllocations(ctx, client, "gpu.dra.dev", "node-1")
	waitFor := func(what string, want ...string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return a.Synced() && slices.Equal(slices.Sorted(maps.Keys(a.AllocatedDevices())), want), nil
		})
		if err != nil {
			t.Fatalf("%s: allocated %v, want %v", what, slices.Sorted(maps.Keys(a.AllocatedDevices())), want)
		}
	}
	waitFor("listed", "gpu-0-mig-1g10gb-6")
	select {
	case <-a.AllocationsChanged():
	case <-time.After(10 * time.Second):
		t.Fatal("no change signaled after the list")
	}

	claims := client.ResourceV1().ResourceClaims("default")
	pending := allocatedClaim("pending", result("gpu.dra.dev", "node-1", "gpu-1-ts"))
	if _, err := claims.UpdateStatus(ctx, pending, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("allocated", "gpu-0-mig-1g10gb-6", "gpu-1-ts")
	select {
	case <-a.AllocationsChanged():
	case <-time.After(10 * time.Second):
		t.Fatal("no change signaled after an allocation")
	}
	if _, err := claims.UpdateStatus(ctx, allocatedClaim("pending"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("deallocated", "gpu-0-mig-1g10gb-6")
	if err := claims.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("deleted")
}
