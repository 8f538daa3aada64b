package v1beta1

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// fieldErr is the part of a field.Error a test asserts on.
type fieldErr struct {
	Type  field.ErrorType
	Field string
}

func summarize(errs field.ErrorList) []fieldErr {
	var out []fieldErr
	for _, e := range errs {
		out = append(out, fieldErr{e.Type, e.Field})
	}
	return out
}

func TestValidate(t *testing.T) {
	tests := map[string]struct {
		cfg  Config
		want []fieldErr
	}{
		"nil GpuConfig":                   {cfg: (*GpuConfig)(nil)},
		"GpuConfig without sharing":       {cfg: &GpuConfig{}},
		"MigDeviceConfig without sharing": {cfg: &MigDeviceConfig{}},
		"undefaulted TimeSlicing": {
			cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicingStrategy}},
		},
		"undefaulted MPS": {
			cfg: &MigDeviceConfig{Sharing: &MigDeviceSharing{Strategy: MPSStrategy}},
		},
		"every interval": {
			cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(MediumTimeSlice)}}},
		},
		"full MPS": {
			cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: MPSStrategy, MPSConfig: &MPSConfig{
				DefaultActiveThreadPercentage:  ptr(1),
				DefaultPinnedDeviceMemoryLimit: ptr(resource.MustParse("1Ti")),
				DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{
					"0": resource.MustParse("1Mi"),
					"GPU-00000000-0000-0000-0000-000000000001": resource.MustParse("40Gi"),
					"GPU-00000000-0000-0000-0000-000000000000": resource.MustParse("1.5Gi"),
				},
				ClientPriority: ptr(BelowNormalMPSClientPriority),
			}}},
		},
		"empty strategy": {
			cfg:  &GpuConfig{Sharing: &GpuSharing{}},
			want: []fieldErr{{field.ErrorTypeRequired, "sharing.strategy"}},
		},
		"empty MIG strategy": {
			cfg:  &MigDeviceConfig{Sharing: &MigDeviceSharing{}},
			want: []fieldErr{{field.ErrorTypeRequired, "sharing.strategy"}},
		},
		"unknown strategy does not also forbid sub-configs": {
			cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: "Fractional",
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(TimeSliceInterval("Eternal"))},
				MPSConfig:         &MPSConfig{DefaultActiveThreadPercentage: ptr(0)}}},
			want: []fieldErr{
				{field.ErrorTypeNotSupported, "sharing.strategy"},
				{field.ErrorTypeNotSupported, "sharing.timeSlicingConfig.interval"},
				{field.ErrorTypeInvalid, "sharing.mpsConfig.defaultActiveThreadPercentage"},
			},
		},
		"forbidden sub-configs are not validated inside": {
			cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: ExclusiveStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(TimeSliceInterval("Eternal"))},
				MPSConfig:         &MPSConfig{DefaultActiveThreadPercentage: ptr(0)}}},
			want: []fieldErr{
				{field.ErrorTypeForbidden, "sharing.timeSlicingConfig"},
				{field.ErrorTypeForbidden, "sharing.mpsConfig"},
			},
		},
		"MIG mpsConfig with Exclusive": {
			cfg:  &MigDeviceConfig{Sharing: &MigDeviceSharing{Strategy: ExclusiveStrategy, MPSConfig: &MPSConfig{}}},
			want: []fieldErr{{field.ErrorTypeForbidden, "sharing.mpsConfig"}},
		},
		"MIG MPS limits": {
			cfg: &MigDeviceConfig{Sharing: &MigDeviceSharing{Strategy: MPSStrategy, MPSConfig: &MPSConfig{
				DefaultActiveThreadPercentage:  ptr(-1),
				DefaultPinnedDeviceMemoryLimit: ptr(resource.MustParse("0")),
				DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{
					"MIG-00000000-0000-0000-0000-000000000000": resource.MustParse("2Ti"),
					"GPU-00000000-0000-0000-0000-000000000000": resource.MustParse("1Gi"),
				},
			}}},
			want: []fieldErr{
				{field.ErrorTypeInvalid, "sharing.mpsConfig.defaultActiveThreadPercentage"},
				{field.ErrorTypeInvalid, "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"},
				// Keys in sorted order.
				{field.ErrorTypeInvalid, "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[GPU-00000000-0000-0000-0000-000000000000]"},
				{field.ErrorTypeInvalid, "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[MIG-00000000-0000-0000-0000-000000000000]"},
			},
		},
		"too many per-device limits": {
			cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: MPSStrategy, MPSConfig: &MPSConfig{
				DefaultPerDevicePinnedMemoryLimit: manyLimits(33),
			}}},
			want: []fieldErr{
				{field.ErrorTypeTooMany, "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit"},
			},
		},
		// Quantities built in Go skip the decoder's guard; Validate must
		// still answer at once (Cmp alone would run for minutes).
		"extreme quantities built in Go": {
			cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: MPSStrategy, MPSConfig: &MPSConfig{
				DefaultPinnedDeviceMemoryLimit: resource.NewScaledQuantity(1, 999999999),
				DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{
					uuid(0): *resource.NewScaledQuantity(1, -999999999),
					uuid(1): *resource.NewScaledQuantity(1048575, 0),
					uuid(2): *resource.NewScaledQuantity(1099511627777, 0),
					uuid(3): *resource.NewScaledQuantity(10485760, -1),   // exactly 1Mi
					uuid(4): *resource.NewScaledQuantity(10485761, -1),   // 1Mi and a tenth of a byte
					uuid(5): *resource.NewScaledQuantity(1048576001, -3), // 1Mi and a byte
				},
			}}},
			want: []fieldErr{
				{field.ErrorTypeInvalid, "sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"},
				{field.ErrorTypeInvalid, "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[" + uuid(0) + "]"},
				{field.ErrorTypeInvalid, "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[" + uuid(1) + "]"},
				{field.ErrorTypeInvalid, "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[" + uuid(2) + "]"},
				{field.ErrorTypeInvalid, "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[" + uuid(4) + "]"},
				{field.ErrorTypeInvalid, "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[" + uuid(5) + "]"},
			},
		},
		"unknown client priority": {
			cfg: &GpuConfig{Sharing: &GpuSharing{Strategy: MPSStrategy,
				MPSConfig: &MPSConfig{ClientPriority: ptr(MPSClientPriority("High"))}}},
			want: []fieldErr{{field.ErrorTypeNotSupported, "sharing.mpsConfig.clientPriority"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, summarize(tc.cfg.Validate())); diff != "" {
				t.Errorf("Validate (-want +got):\n%s", diff)
			}
		})
	}
}

func manyLimits(n int) map[string]resource.Quantity {
	m := map[string]resource.Quantity{}
	for i := range n {
		m[uuid(i)] = resource.MustParse("1Gi")
	}
	return m
}

// uuid is the i-th of a series of GPU UUIDs, in sorted order.
func uuid(i int) string { return fmt.Sprintf("GPU-00000000-0000-0000-0000-%012x", i) }

func TestTimeSliceIntervalComputePolicyValue(t *testing.T) {
	tests := map[TimeSliceInterval]int{
		DefaultTimeSlice: 0,
		ShortTimeSlice:   1,
		MediumTimeSlice:  2,
		LongTimeSlice:    3,
	}
	for interval, want := range tests {
		got, err := interval.ComputePolicyValue()
		if err != nil || got != want {
			t.Errorf("%s.ComputePolicyValue() = %d, %v; want %d, nil", interval, got, err, want)
		}
	}
	for _, bad := range []TimeSliceInterval{"", "long", "4"} {
		if got, err := bad.ComputePolicyValue(); err == nil {
			t.Errorf("%q.ComputePolicyValue() = %d, nil; want an error", bad, got)
		}
	}
}

func TestMPSClientPriorityEnvValue(t *testing.T) {
	tests := map[MPSClientPriority]string{
		NormalMPSClientPriority:      "0",
		BelowNormalMPSClientPriority: "1",
	}
	for priority, want := range tests {
		got, err := priority.EnvValue()
		if err != nil || got != want {
			t.Errorf("%s.EnvValue() = %q, %v; want %q, nil", priority, got, err, want)
		}
	}
	for _, bad := range []MPSClientPriority{"", "normal", "High"} {
		if got, err := bad.EnvValue(); err == nil {
			t.Errorf("%q.EnvValue() = %q, nil; want an error", bad, got)
		}
	}
}
