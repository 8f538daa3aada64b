package imexchannels

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const nvidia = vocabulary.NVIDIADriverName

// foreignSlice is a slice of driver with the pool, node (or a clique
// selector when "") and field manager.
func foreignSlice(name, driverName, pool, nodeName, manager string) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name),
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate}}},
		Spec: resourceapi.ResourceSliceSpec{Driver: driverName, Pool: resourceapi.ResourcePool{Name: pool, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "channel-0"}}},
	}
	if nodeName != "" {
		s.Spec.NodeName = ptr.To(nodeName)
	} else {
		s.Spec.NodeSelector = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
	}
	return s
}

// sliceNames lists the names of the slices of driverName.
func sliceNames(t *testing.T, client kubernetes.Interface, driverName string) []string {
	t.Helper()
	list, err := client.ResourceV1().ResourceSlices().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range list.Items {
		if s.Spec.Driver == driverName {
			out = append(out, s.Name)
		}
	}
	slices.Sort(out)
	return out
}

// TestLeftoversAfterDriverSwitch: the chart's compat.nvidia switch restarts
// the controller under the other driver name. The channel pools it published
// under the old name go; every other slice of that name stays: NVIDIA's
// driver's, another writer's pool of the same shape, a node's.
func TestLeftoversAfterDriverSwitch(t *testing.T) {
	const a = "5e1f0000-0000-0000-0000-00000000000a.1"
	for _, tc := range []struct{ from, to string }{{driver, nvidia}, {nvidia, driver}} {
		t.Run(tc.from+" to "+tc.to, func(t *testing.T) {
			pool := vocabulary.ChannelPoolName(a)
			kept := []*resourceapi.ResourceSlice{
				foreignSlice("nvidia-node", tc.from, "tray-1", "tray-1", "gpu-kubelet-plugin"),
				foreignSlice("same-shape-other-writer", tc.from, pool, "", "kubectl-create"),
				foreignSlice("ours-with-a-node", tc.from, pool, "tray-1", vocabulary.ControllerAgent),
				foreignSlice("ours-other-pool", tc.from, "gpu-models", "", vocabulary.ControllerAgent),
				foreignSlice("ours-third-driver", "gpu.example.com", pool, "", vocabulary.ControllerAgent),
			}
			client := newClient(node("tray-1", a))
			stop := startDriver(t, client, tc.from, 2)
			published := publishedPools(t, client, tc.from, map[string]int{a: 2})
			stop()
			// Written by others meanwhile (the slice controller of the old
			// name would have taken those in its pools as its own).
			for _, s := range kept {
				if err := client.Tracker().Add(s); err != nil {
					t.Fatal(err)
				}
			}

			t.Cleanup(startDriver(t, client, tc.to, 2))
			publishedPools(t, client, tc.to, map[string]int{a: 2})
			err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
				for _, s := range published {
					if _, err := client.ResourceV1().ResourceSlices().Get(ctx, s.Name, metav1.GetOptions{}); err == nil {
						return false, nil
					}
				}
				return true, nil
			})
			if err != nil {
				t.Errorf("the channel slices published under %s are still there: %v", tc.from, sliceNames(t, client, tc.from))
			}
			for _, s := range kept {
				if _, err := client.ResourceV1().ResourceSlices().Get(t.Context(), s.Name, metav1.GetOptions{}); err != nil {
					t.Errorf("slice %s (driver %s) was not the controller's, and is gone: %v", s.Name, s.Spec.Driver, err)
				}
			}
		})
	}
}

// TestLeftoversOtherDriverName: under a driver name of its own the
// controller knows of no other name it published under.
func TestLeftoversOtherDriverName(t *testing.T) {
	for name, want := range map[string]string{driver: nvidia, nvidia: driver, "gpu.example.com": ""} {
		if got := otherDriverName(name); got != want {
			t.Errorf("other driver name of %s: %q, want %q", name, got, want)
		}
	}
}

// TestLeftoversAppearingLater: during a rolling switch an instance under
// the old name still runs and recreates its pools after the first pass;
// the controller removes them on a later one.
func TestLeftoversAppearingLater(t *testing.T) {
	const a = "5e1f0000-0000-0000-0000-00000000000a.1"
	client := newClient(node("tray-1", a))
	t.Cleanup(startDriverEvery(t, client, nvidia, 2, 50*time.Millisecond))
	publishedPools(t, client, nvidia, map[string]int{a: 2})
	// After the first pass, which found nothing.
	time.Sleep(100 * time.Millisecond)
	late := foreignSlice("recreated-by-the-old-instance", driver, vocabulary.ChannelPoolName(a), "", vocabulary.ControllerAgent)
	other := foreignSlice("same-shape-other-writer", driver, vocabulary.ChannelPoolName(a), "", "kubectl-create")
	for _, s := range []*resourceapi.ResourceSlice{late, other} {
		if err := client.Tracker().Add(s); err != nil {
			t.Fatal(err)
		}
	}
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.ResourceV1().ResourceSlices().Get(ctx, late.Name, metav1.GetOptions{})
		return err != nil, nil
	})
	if err != nil {
		t.Errorf("the channel slice recreated under %s after the first pass is still there: %v", driver, sliceNames(t, client, driver))
	}
	if _, err := client.ResourceV1().ResourceSlices().Get(t.Context(), other.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("slice %s was not the controller's, and is gone: %v", other.Name, err)
	}
}
