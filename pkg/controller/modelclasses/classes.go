// Package modelclasses keeps one DeviceClass per GPU model found in the
// driver's ResourceSlices, e.g. nvidia-h100-80gb-hbm3.gpu.dra.dev selecting
// whole H100 80GB HBM3 GPUs, so a claim can ask for a model by class name
// instead of a CEL selector, and (opt-in) one per MIG profile found there,
// e.g. mig-1g.10gb.gpu.dra.dev serving the device plugin's
// nvidia.com/mig-1g.10gb. Classes are created as models and profiles
// appear and deleted when they have left the cluster for a grace period.
package modelclasses

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Labels and annotations of the classes.
const (
	// ManagedByLabel is set to ManagedByValue on every class the
	// controller creates.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "gpu-dra-controller"
)

// ModelClassLabel marks the per-model classes of a driver:
// <driver>/model-class=true. The controller manages only classes with it.
func ModelClassLabel(driverName string) string { return driverName + "/model-class" }

// ProductAnnotation names the product(s) a class selects.
func ProductAnnotation(driverName string) string { return driverName + "/product-name" }

var nonName = regexp.MustCompile(`[^a-z0-9]+`)

// ClassName is the class of a product: the product name in lower case,
// every run of other characters than letters and digits one '-', then the
// driver name ("NVIDIA H100 80GB HBM3" → nvidia-h100-80gb-hbm3.gpu.dra.dev).
// It is "" when that is no valid object name.
func ClassName(driverName, product string) string {
	base := strings.Trim(nonName.ReplaceAllString(strings.ToLower(product), "-"), "-")
	if base == "" {
		return ""
	}
	name := base + "." + driverName
	if len(validation.IsDNS1123Subdomain(name)) > 0 {
		return ""
	}
	return name
}

// Products are the distinct product names of the whole GPUs in slices of
// driverName (newest generation of each pool), sorted.
func Products(driverName string, in []*resourceapi.ResourceSlice) []string {
	set := map[string]bool{}
	for _, attrs := range currentDevices(driverName, in) {
		typ, product := attrs[vocabulary.AttrType], attrs[vocabulary.AttrProductName]
		if typ.StringValue != nil && vocabulary.Kind(*typ.StringValue) == vocabulary.KindGPU &&
			product.StringValue != nil && *product.StringValue != "" {
			set[*product.StringValue] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// currentDevices are the attributes of the devices in the newest
// generation of each of driverName's pools.
func currentDevices(driverName string, in []*resourceapi.ResourceSlice) []map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	gen := map[string]int64{}
	for _, s := range in {
		if s.Spec.Driver == driverName {
			gen[s.Spec.Pool.Name] = max(gen[s.Spec.Pool.Name], s.Spec.Pool.Generation)
		}
	}
	var out []map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	for _, s := range in {
		if s.Spec.Driver != driverName || s.Spec.Pool.Generation != gen[s.Spec.Pool.Name] {
			continue
		}
		for i := range s.Spec.Devices {
			out = append(out, s.Spec.Devices[i].Attributes)
		}
	}
	return out
}

// DeviceClasses renders the classes for products, sorted by name. Products
// whose names map to the same class (they differ only in punctuation or
// case) share it; its selector accepts each of them.
func DeviceClasses(driverName string, products []string) []*resourceapi.DeviceClass {
	byName := map[string][]string{}
	for _, p := range products {
		if name := ClassName(driverName, p); name != "" {
			byName[name] = append(byName[name], p)
		}
	}
	whole := deviceclass.Class{DeviceType: vocabulary.KindGPU}
	out := make([]*resourceapi.DeviceClass, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		ps := byName[name]
		slices.Sort(ps)
		conds := make([]string, 0, len(ps))
		for _, p := range ps {
			conds = append(conds, fmt.Sprintf("device.attributes[%q].%s == %q", driverName, vocabulary.AttrProductName, p))
		}
		productCond := strings.Join(conds, " || ")
		if len(conds) > 1 {
			productCond = "(" + productCond + ")"
		}
		out = append(out, &resourceapi.DeviceClass{
			TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
			ObjectMeta: metav1.ObjectMeta{
				Name: name,
				Labels: map[string]string{
					ManagedByLabel:              ManagedByValue,
					ModelClassLabel(driverName): "true",
				},
				Annotations: map[string]string{
					vocabulary.AnnotationDescription: fmt.Sprintf("A whole %s GPU, exclusively.", strings.Join(ps, " or ")),
					ProductAnnotation(driverName):    strings.Join(ps, ","),
				},
			},
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: whole.Selector(driverName) + " && " + productCond,
				}}},
			},
		})
	}
	return out
}
