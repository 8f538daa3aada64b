package kubectlgpu

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// domain qualifies names with the driver's domain, each once.
type domain struct {
	driver    string
	qualified map[string]resourceapi.QualifiedName
}

func newDomain(driver string) *domain {
	d := &domain{driver: driver, qualified: map[string]resourceapi.QualifiedName{}}
	for _, name := range []string{vocabulary.AttrType, vocabulary.AttrUUID, vocabulary.AttrMinor,
		vocabulary.AttrProductName, vocabulary.AttrArchitecture, vocabulary.AttrCUDAComputeCapability,
		vocabulary.AttrDriverVersion, vocabulary.AttrCUDADriverVersion, vocabulary.AttrMIGCapable,
		vocabulary.AttrMIGEnabled, vocabulary.AttrNVLinkDomain, vocabulary.AttrProfile, vocabulary.AttrParentUUID,
		vocabulary.AttrParentMinor, vocabulary.AttrPlacementStart, vocabulary.AttrStatic,
		vocabulary.CapacityMemory, vocabulary.CapacityShares, vocabulary.CapacityCompute} {
		d.qualified[name] = resourceapi.QualifiedName(driver + "/" + name)
	}
	return d
}

// qualify returns driver/name; names already qualified stay as they are.
func (d *domain) qualify(name string) resourceapi.QualifiedName {
	if q, ok := d.qualified[name]; ok {
		return q
	}
	if strings.Contains(name, "/") {
		return resourceapi.QualifiedName(name)
	}
	return resourceapi.QualifiedName(d.driver + "/" + name)
}

// attributes reads a device's attributes in one driver's domain: an
// unqualified name is found whether the slice spells it "productName" or
// "gpu.dra.dev/productName".
type attributes struct {
	*domain
	attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
}

func (a attributes) get(name string) (resourceapi.DeviceAttribute, bool) {
	if v, ok := a.attrs[resourceapi.QualifiedName(name)]; ok {
		return v, true
	}
	if strings.Contains(name, "/") {
		return resourceapi.DeviceAttribute{}, false
	}
	v, ok := a.attrs[a.qualify(name)]
	return v, ok
}

// str returns a string or version attribute, "" when absent.
func (a attributes) str(name string) string {
	v, ok := a.get(name)
	switch {
	case !ok:
		return ""
	case v.StringValue != nil:
		return *v.StringValue
	case v.VersionValue != nil:
		return *v.VersionValue
	}
	return ""
}

func (a attributes) int(name string) (int64, bool) {
	v, ok := a.get(name)
	if !ok || v.IntValue == nil {
		return 0, false
	}
	return *v.IntValue, true
}

func (a attributes) bool(name string) bool {
	v, ok := a.get(name)
	return ok && v.BoolValue != nil && *v.BoolValue
}

// unqualify keys quantities by name without the driver's domain:
// "gpu.dra.dev/memory" and "memory" are both "memory".
func unqualify(driver string, m map[resourceapi.QualifiedName]resource.Quantity) map[string]resource.Quantity {
	if m == nil {
		return nil
	}
	out := make(map[string]resource.Quantity, len(m))
	for k, v := range m {
		out[strings.TrimPrefix(string(k), driver+"/")] = v
	}
	return out
}
