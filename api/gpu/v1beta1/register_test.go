package v1beta1

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Opaque configs of this group are addressed to the driver of the same name.
func TestGroupIsTheDriverName(t *testing.T) {
	if GroupName != vocabulary.DriverName {
		t.Errorf("API group %q, driver %q: configs would be addressed to another driver than their group", GroupName, vocabulary.DriverName)
	}
}

func TestAddToScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for obj, kind := range map[runtime.Object]string{
		&GpuConfig{}:       GpuConfigKind,
		&MigDeviceConfig{}: MigDeviceConfigKind,
	} {
		gvks, _, err := s.ObjectKinds(obj)
		if err != nil {
			t.Fatalf("ObjectKinds(%T): %v", obj, err)
		}
		want := []schema.GroupVersionKind{{Group: "gpu.dra.dev", Version: "v1beta1", Kind: kind}}
		if diff := cmp.Diff(want, gvks); diff != "" {
			t.Errorf("ObjectKinds(%T) (-want +got):\n%s", obj, diff)
		}
		created, err := s.New(want[0])
		if err != nil {
			t.Fatalf("New(%v): %v", want[0], err)
		}
		if _, ok := created.(Config); !ok {
			t.Errorf("New(%v) = %T, which is not a Config", want[0], created)
		}
	}
}

// TestDeepCopy checks that a copy of a fully populated config shares no
// memory with the original.
func TestDeepCopy(t *testing.T) {
	full := func() *GpuConfig {
		return &GpuConfig{TypeMeta: gpuTypeMeta, Sharing: &GpuSharing{
			Strategy:          MPSStrategy,
			TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(LongTimeSlice)},
			MPSConfig: &MPSConfig{
				DefaultActiveThreadPercentage:     ptr(50),
				DefaultPinnedDeviceMemoryLimit:    ptr(resource.MustParse("1Gi")),
				DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{"0": resource.MustParse("2Gi")},
				ClientPriority:                    ptr(BelowNormalMPSClientPriority),
			},
		}}
	}
	orig := full()
	cp := orig.DeepCopyObject().(*GpuConfig)
	if diff := cmp.Diff(orig, cp, cmpQuantities); diff != "" {
		t.Fatalf("copy differs (-orig +copy):\n%s", diff)
	}
	cp.Kind = "changed"
	cp.Sharing.Strategy = ExclusiveStrategy
	*cp.Sharing.TimeSlicingConfig.Interval = ShortTimeSlice
	*cp.Sharing.MPSConfig.DefaultActiveThreadPercentage = 1
	cp.Sharing.MPSConfig.DefaultPinnedDeviceMemoryLimit.Add(resource.MustParse("1Gi"))
	cp.Sharing.MPSConfig.DefaultPerDevicePinnedMemoryLimit["1"] = resource.MustParse("3Gi")
	*cp.Sharing.MPSConfig.ClientPriority = NormalMPSClientPriority
	if diff := cmp.Diff(full(), orig, cmpQuantities); diff != "" {
		t.Errorf("changing the copy changed the original (-want +got):\n%s", diff)
	}

	migOrig := &MigDeviceConfig{TypeMeta: migTypeMeta, Sharing: &MigDeviceSharing{
		Strategy: MPSStrategy, MPSConfig: &MPSConfig{DefaultActiveThreadPercentage: ptr(5)}}}
	migCopy := migOrig.DeepCopyObject().(*MigDeviceConfig)
	*migCopy.Sharing.MPSConfig.DefaultActiveThreadPercentage = 6
	if *migOrig.Sharing.MPSConfig.DefaultActiveThreadPercentage != 5 {
		t.Error("changing the MIG copy changed the original")
	}
	if (*GpuConfig)(nil).DeepCopyObject() != nil || (*MigDeviceConfig)(nil).DeepCopyObject() != nil {
		t.Error("DeepCopyObject of nil is not nil")
	}
}
