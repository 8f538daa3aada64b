package v1beta1

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// The scheme knows the two kinds under NVIDIA's group and version.
func TestScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for kind, obj := range map[string]runtime.Object{GpuConfigKind: &GpuConfig{}, MigDeviceConfigKind: &MigDeviceConfig{}} {
		gvks, _, err := s.ObjectKinds(obj)
		if err != nil || len(gvks) != 1 || gvks[0] != (schema.GroupVersionKind{Group: "resource.nvidia.com", Version: "v1beta1", Kind: kind}) {
			t.Errorf("%s: kinds %v (%v)", kind, gvks, err)
		}
	}
}

// A deep copy shares nothing with its original: changing every pointer,
// map and nested value of the original leaves the copy as it was.
func TestDeepCopy(t *testing.T) {
	full := func() (*GpuConfig, *MigDeviceConfig) {
		mps := &MpsConfig{
			DefaultActiveThreadPercentage:     ptr.To(50),
			DefaultPinnedDeviceMemoryLimit:    ptr.To(resource.MustParse("1Gi")),
			DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{"0": resource.MustParse("2Gi")},
		}
		return &GpuConfig{Sharing: &GpuSharing{
				Strategy:          MPSStrategy,
				TimeSlicingConfig: &gpuv1beta1.TimeSlicingConfig{Interval: ptr.To(gpuv1beta1.LongTimeSlice)},
				MpsConfig:         mps,
			}}, &MigDeviceConfig{Sharing: &MigDeviceSharing{
				Strategy: MPSStrategy, MpsConfig: mps.DeepCopy(),
			}}
	}
	mutate := func(m *MpsConfig) {
		*m.DefaultActiveThreadPercentage = 1
		*m.DefaultPinnedDeviceMemoryLimit = resource.MustParse("3Gi")
		m.DefaultPerDevicePinnedMemoryLimit["0"] = resource.MustParse("4Gi")
		m.DefaultPerDevicePinnedMemoryLimit["1"] = resource.MustParse("5Gi")
	}

	gpu, _ := full()
	want, _ := full()
	copied := gpu.DeepCopyObject().(*GpuConfig)
	gpu.Sharing.Strategy = TimeSlicingStrategy
	*gpu.Sharing.TimeSlicingConfig.Interval = gpuv1beta1.ShortTimeSlice
	mutate(gpu.Sharing.MpsConfig)
	if !equality.Semantic.DeepEqual(copied, want) {
		t.Errorf("GpuConfig copy changed with its original: %#v", copied.Sharing)
	}

	_, mig := full()
	_, wantMIG := full()
	copiedMIG := mig.DeepCopyObject().(*MigDeviceConfig)
	mig.Sharing.Strategy = TimeSlicingStrategy
	mutate(mig.Sharing.MpsConfig)
	if !equality.Semantic.DeepEqual(copiedMIG, wantMIG) {
		t.Errorf("MigDeviceConfig copy changed with its original: %#v", copiedMIG.Sharing)
	}
}
