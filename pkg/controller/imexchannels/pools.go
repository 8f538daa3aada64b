// Package imexchannels publishes the IMEX channels of every NVLink clique
// as ResourceSlices: one pool per clique (vocabulary.ChannelPoolName), whose
// node selector is the clique's node label (vocabulary.LabelClique, written
// by pkg/controller/nodelabels). Every channel claim of a ComputeDomain
// selects the domain's channel number (status.channel, reserved by
// pkg/controller/computedomain); allocated from such a pool it keeps its
// pod on the clique's nodes. A channel device may be allocated many times
// (allowMultipleAllocations): to each pod's claim of a domain in template
// mode. The controller's reservation, not the allocator, keeps two domains
// off one channel (docs/compute-domains.md). After the chart's compat.nvidia switch it
// deletes the pools it published under the other driver name
// (leftovers.go).
package imexchannels

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Bounds of the number of channels published per clique. One slice holds
// them all (resourceapi.ResourceSliceMaxDevices is 128); the simulated trays
// have 64 channel device nodes, real drivers 2048.
const (
	DefaultChannels = 32
	MaxChannels     = resourceapi.ResourceSliceMaxDevices
)

// ValidateChannels checks a channel count; flag names the flag (or chart
// value) in the error.
func ValidateChannels(flag string, n int) error {
	if n < 1 || n > MaxChannels {
		return fmt.Errorf("%s (%d) must be between 1 and %d", flag, n, MaxChannels)
	}
	return nil
}

// Cliques lists, sorted and once each, the cliques the nodes' clique
// labels name. A value that cannot name a pool (not set by the controller)
// is skipped and returned in invalid.
func Cliques(nodes []*corev1.Node) (cliques, invalid []string) {
	seen := map[string]bool{}
	for _, n := range nodes {
		clique := n.Labels[vocabulary.LabelClique]
		if clique == "" || seen[clique] {
			continue
		}
		seen[clique] = true
		if len(validation.IsDNS1123Subdomain(vocabulary.ChannelPoolName(clique))) > 0 {
			invalid = append(invalid, clique)
			continue
		}
		cliques = append(cliques, clique)
	}
	slices.Sort(cliques)
	slices.Sort(invalid)
	return cliques, invalid
}

// Resources is the desired set of channel pools: per clique, channels
// devices channel-0..channel-(channels-1) in one slice, selecting the
// clique's nodes by label.
func Resources(cliques []string, channels int) *resourceslice.DriverResources {
	pools := make(map[string]resourceslice.Pool, len(cliques))
	for _, clique := range cliques {
		pools[vocabulary.ChannelPoolName(clique)] = resourceslice.Pool{
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: vocabulary.LabelClique, Operator: corev1.NodeSelectorOpIn, Values: []string{clique},
				}},
			}}},
			Slices: []resourceslice.Slice{{Devices: devices(clique, channels)}},
		}
	}
	return &resourceslice.DriverResources{Pools: pools}
}

// devices are a clique's channel devices. Attribute names are unqualified,
// so in the driver's domain, as on the nodes' devices. Each may be
// allocated to many claims: the claims of one domain, each pod its own
// (DRAConsumableCapacity, beta and on by default since Kubernetes 1.36).
func devices(clique string, channels int) []resourceapi.Device {
	cluster := clusterUUID(clique)
	out := make([]resourceapi.Device, channels)
	for n := range channels {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			vocabulary.AttrType:     {StringValue: ptr.To(string(vocabulary.KindIMEXChannel))},
			vocabulary.AttrChannel:  {IntValue: ptr.To(int64(n))},
			vocabulary.AttrCliqueID: {StringValue: ptr.To(clique)},
		}
		if cluster != "" {
			attrs[vocabulary.AttrClusterUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(cluster)}
		}
		out[n] = resourceapi.Device{Name: vocabulary.ChannelDeviceName(n), Attributes: attrs, AllowMultipleAllocations: ptr.To(true)}
	}
	return out
}

// clusterUUID is the cluster UUID part of "<cluster UUID>.<clique ID>".
func clusterUUID(clique string) string {
	i := strings.LastIndexByte(clique, '.')
	if i <= 0 {
		return ""
	}
	return clique[:i]
}
