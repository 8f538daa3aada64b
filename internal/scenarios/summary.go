package scenarios

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// GPUUse is what one GPU of a node is used for.
type GPUUse struct {
	Minor   int
	Product string
	UUID    string
	// Uses lists "<kind> <detail> <- ns/claim" entries.
	Uses []string
}

// NodeSummary reports, per GPU of the node's pool, which claims use it and how
// (whole, MIG profile and placement, time-slicing or MPS share with its capacity).
func (r *Runner) NodeSummary(ctx context.Context, node string) ([]GPUUse, error) {
	slices, err := r.Cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: "spec.driver=" + r.Driver + ",spec.nodeName=" + node,
	})
	if err != nil {
		return nil, err
	}
	attrs := map[string]map[string]string{} // device -> attributes
	gpus := map[int]*GPUUse{}
	pool := ""
	for _, s := range slices.Items {
		pool = s.Spec.Pool.Name
		for _, d := range s.Spec.Devices {
			a := attributeStrings(r.Driver, d.Attributes)
			attrs[d.Name] = a
			if deviceKind(a) == vocabulary.KindGPU {
				minor, _ := strconv.Atoi(a[vocabulary.AttrMinor])
				gpus[minor] = &GPUUse{Minor: minor, Product: a[vocabulary.AttrProductName], UUID: a[vocabulary.AttrUUID]}
			}
		}
	}
	claims, err := r.Cluster.Client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.Driver != r.Driver || res.Pool != pool {
				continue
			}
			a := attrs[res.Device]
			d := DeviceReport{Attributes: a}
			minor, err := strconv.Atoi(d.GPU())
			if err != nil || gpus[minor] == nil {
				continue
			}
			use := ""
			switch deviceKind(a) {
			case vocabulary.KindGPU:
				use = "whole GPU"
			case vocabulary.KindMIG:
				use = fmt.Sprintf("MIG %s at placement %s", a[vocabulary.AttrProfile], a[vocabulary.AttrPlacementStart])
			case vocabulary.KindTimeSlice, vocabulary.KindMPS:
				var caps []string
				for name, q := range res.ConsumedCapacity {
					caps = append(caps, fmt.Sprintf("%s=%s", name, q.String()))
				}
				sort.Strings(caps)
				kind := map[vocabulary.Kind]string{vocabulary.KindTimeSlice: "time-sliced", vocabulary.KindMPS: "MPS"}[deviceKind(a)]
				use = fmt.Sprintf("%s share (%s)", kind, strings.Join(caps, " "))
			default:
				use = a[vocabulary.AttrType]
			}
			gpus[minor].Uses = append(gpus[minor].Uses, fmt.Sprintf("%s <- %s/%s", use, c.Namespace, c.Name))
		}
	}
	out := make([]GPUUse, 0, len(gpus))
	for _, g := range gpus {
		sort.Strings(g.Uses)
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Minor < out[j].Minor })
	return out, nil
}
