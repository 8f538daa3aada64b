package coexistence

import (
	"context"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// NVIDIA's DRA driver (k8s-dra-driver-gpu) publishes its node's GPUs in
// ResourceSlices of the driver gpu.nvidia.com, spec.nodeName the node. Its
// kubelet plugin and this one must never publish the same GPUs, so those
// slices are a conflict like a device plugin's allocatable.
//
// Under the chart's compat.nvidia profile this plugin publishes under
// gpu.nvidia.com too, so the driver name does not tell the two apart. What
// does is the field manager the API server records in managedFields: when
// a request names none it takes the writer's user agent up to its first '/'
// (vocabulary.KubeletPluginAgent for this plugin, whose slices the kubelet
// plugin helper writes without a field manager of its own). So every slice
// this plugin created carries it, also those of an earlier run of the
// plugin, and NVIDIA's plugin, which identifies as gpu-kubelet-plugin,
// never does. A label would need the helper to write one, which it cannot.
// Neither can be forged by a tenant: ResourceSlices are cluster-scoped and
// only cluster administrators and DRA drivers may write them (with the
// chart's ValidatingAdmissionPolicy, this plugin's service account only its
// own node's). Whoever may write them can name any field manager, but could
// as well delete or rewrite this plugin's slices, so the marker gives such a
// writer nothing more.

// ours says whether this plugin wrote the slice: one of its managedFields
// entries is of the plugin's field manager.
func ours(slice *resourceapi.ResourceSlice) bool {
	return slices.ContainsFunc(slice.ManagedFields, func(e metav1.ManagedFieldsEntry) bool {
		return e.Manager == vocabulary.KubeletPluginAgent
	})
}

// DRADriverConflicts lists the ResourceSlices of NVIDIA's DRA driver among
// slices (all of driver gpu.nvidia.com on one node): those this plugin did
// not write, as sorted "ResourceSlice <name> (<n> devices)".
func DRADriverConflicts(list []resourceapi.ResourceSlice) []string {
	var out []string
	for i := range list {
		if s := &list[i]; !ours(s) {
			out = append(out, fmt.Sprintf("ResourceSlice %s (%d devices)", s.Name, len(s.Spec.Devices)))
		}
	}
	slices.Sort(out)
	return out
}

// nvidiaSlices reads the node's ResourceSlices of NVIDIA's driver name.
func (g *Gate) nvidiaSlices(ctx context.Context) ([]resourceapi.ResourceSlice, error) {
	list, err := g.opts.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		// resourceVersion 0: from the API server's cache, like the Node.
		ResourceVersion: "0",
		FieldSelector: fields.Set{
			resourceapi.ResourceSliceSelectorDriver:   vocabulary.NVIDIADriverName,
			resourceapi.ResourceSliceSelectorNodeName: g.opts.NodeName,
		}.String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices of driver %s on node %s: %w", vocabulary.NVIDIADriverName, g.opts.NodeName, err)
	}
	// The field selector is a filter the API server may not apply to a
	// fake or older server; filter again.
	return slices.DeleteFunc(list.Items, func(s resourceapi.ResourceSlice) bool {
		return s.Spec.Driver != vocabulary.NVIDIADriverName || s.Spec.NodeName == nil || *s.Spec.NodeName != g.opts.NodeName
	}), nil
}

// deleteOurs deletes this plugin's own slices among list directly, for the
// one case where withdrawing through the Target would do harm: under
// NVIDIA's driver name, before anything went through the Target. The
// kubelet plugin helper's slice controller owns every slice of its driver
// name on its node; started with an empty publication it would delete
// NVIDIA's slices with this plugin's. Slices left by an earlier run of this
// plugin must go all the same: the scheduler would hand out their devices
// beside NVIDIA's, the same GPUs.
func (g *Gate) deleteOurs(ctx context.Context, list []resourceapi.ResourceSlice) error {
	for i := range list {
		s := &list[i]
		if !ours(s) {
			continue
		}
		err := g.opts.Client.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(s.UID))})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete own ResourceSlice %s: %w", s.Name, err)
		}
		klog.FromContext(ctx).V(2).Info("Deleted own ResourceSlice beside NVIDIA's DRA driver", "slice", s.Name)
	}
	return nil
}
