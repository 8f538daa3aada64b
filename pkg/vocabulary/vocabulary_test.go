package vocabulary_test

import (
	"testing"

	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

func TestAppliesTo(t *testing.T) {
	for name, tc := range map[string]struct {
		requests []string
		request  string
		want     bool
	}{
		"no requests: all":             {request: "gpu", want: true},
		"no requests: subrequest":      {request: "gpu/big", want: true},
		"named":                        {requests: []string{"a", "gpu"}, request: "gpu", want: true},
		"other":                        {requests: []string{"a"}, request: "gpu", want: false},
		"parent names the subrequest":  {requests: []string{"gpu"}, request: "gpu/big", want: true},
		"subrequest named":             {requests: []string{"gpu/big"}, request: "gpu/big", want: true},
		"sibling subrequest":           {requests: []string{"gpu/small"}, request: "gpu/big", want: false},
		"subrequest is not the parent": {requests: []string{"gpu/big"}, request: "gpu", want: false},
		"prefix is not the parent":     {requests: []string{"gp"}, request: "gpu/big", want: false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := vocabulary.AppliesTo(tc.requests, tc.request); got != tc.want {
				t.Errorf("AppliesTo(%q, %q) = %v, want %v", tc.requests, tc.request, got, tc.want)
			}
		})
	}
}

// The package spells the standard attributes out to stay a leaf; they must
// be the upstream names other drivers publish.
func TestStandardAttributes(t *testing.T) {
	for ours, upstream := range map[string]string{
		vocabulary.AttrPCIBusID: string(deviceattribute.StandardDeviceAttributePCIBusID),
		vocabulary.AttrPCIeRoot: string(deviceattribute.StandardDeviceAttributePCIeRoot),
		vocabulary.AttrNUMANode: string(deviceattribute.StandardDeviceAttributeNUMANode),
	} {
		if ours != upstream {
			t.Errorf("attribute %q, upstream publishes %q", ours, upstream)
		}
	}
}

func TestKinds(t *testing.T) {
	seen := map[vocabulary.Kind]bool{}
	for _, k := range vocabulary.Kinds() {
		if !k.Known() || seen[k] {
			t.Errorf("kind %q: known %v, listed twice %v", k, k.Known(), seen[k])
		}
		seen[k] = true
	}
	for _, k := range []vocabulary.Kind{"", "vgpu", "GPU"} {
		if k.Known() {
			t.Errorf("kind %q is known, want unknown", k)
		}
	}
	for k, want := range map[vocabulary.Kind]bool{vocabulary.KindGPU: false, vocabulary.KindMIG: false,
		vocabulary.KindTimeSlice: true, vocabulary.KindMPS: true} {
		if k.Shared() != want {
			t.Errorf("kind %q shared %v, want %v", k, k.Shared(), want)
		}
	}
}
