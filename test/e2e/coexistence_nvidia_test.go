package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/coexistence"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// A ResourceSlice of NVIDIA's driver name on the node, written as NVIDIA's
// kubelet plugin writes it (field manager gpu-kubelet-plugin), makes the
// plugin withdraw the node's slices with a NVIDIADRADriverConflict event;
// once it is deleted the plugin publishes again. First it checks the marker
// the guard relies on: the API server records the plugin's own slices with
// the field manager vocabulary.KubeletPluginAgent.
func TestCoexistenceNVIDIADRADriver(t *testing.T) {
	ctx := testContext(t)
	ours := nodeSlices(t, ctx, env.node)
	if len(ours) == 0 {
		t.Fatalf("no ResourceSlices of %s on node %s before the test", driverName, env.node)
	}
	for _, s := range ours {
		if !slices.ContainsFunc(s.ManagedFields, func(e metav1.ManagedFieldsEntry) bool { return e.Manager == vocabulary.KubeletPluginAgent }) {
			t.Errorf("slice %s has no managedFields entry of %s, which the guard tells the plugin's own slices by: %+v", s.Name, vocabulary.KubeletPluginAgent, s.ManagedFields)
		}
	}
	since := time.Now().Add(-time.Second)
	theirs := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: env.node + "-" + vocabulary.NVIDIADriverName + "-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: vocabulary.NVIDIADriverName, NodeName: ptr.To(env.node),
			Pool:    resourceapi.ResourcePool{Name: env.node, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0"}},
		},
	}
	slicesAPI := env.cluster.Client.ResourceV1().ResourceSlices()
	theirs, err := slicesAPI.Create(ctx, theirs, metav1.CreateOptions{FieldManager: "gpu-kubelet-plugin"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Leave the node publishing for the tests after this one.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := slicesAPI.Delete(ctx, theirs.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Error(err)
		}
		if err := poll(ctx, func(ctx context.Context) (bool, error) { return len(nodeSlices(t, ctx, env.node)) == len(ours), nil }); err != nil {
			t.Errorf("cleanup: node %s does not publish its %d ResourceSlices again: %v", env.node, len(ours), err)
		}
	})
	if err := poll(ctx, func(ctx context.Context) (bool, error) { return len(nodeSlices(t, ctx, env.node)) == 0, nil }); err != nil {
		t.Fatalf("the plugin still publishes beside a %s slice on its node: %v", vocabulary.NVIDIADriverName, err)
	}
	ev := waitNodeEvent(t, ctx, coexistence.ReasonDRAConflict, since)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, theirs.Name) || !strings.Contains(ev.Message, "docs/migration.md") {
		t.Errorf("conflict event %s %q: want a Warning naming %s and docs/migration.md", ev.Type, ev.Message, theirs.Name)
	}
	if err := slicesAPI.Delete(ctx, theirs.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := poll(ctx, func(ctx context.Context) (bool, error) { return len(nodeSlices(t, ctx, env.node)) == len(ours), nil }); err != nil {
		t.Fatalf("the plugin does not publish its %d ResourceSlices again after NVIDIA's slice left: %v", len(ours), err)
	}
	if ev := waitNodeEvent(t, ctx, coexistence.ReasonDRAResolved, since); ev.Type != corev1.EventTypeNormal {
		t.Errorf("resolved event is %s, want Normal", ev.Type)
	}
}
