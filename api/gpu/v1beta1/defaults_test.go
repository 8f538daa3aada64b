package v1beta1

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestDefault(t *testing.T) {
	tests := map[string]struct {
		in, want Config
	}{
		"nil GpuConfig stays nil":       {in: (*GpuConfig)(nil), want: (*GpuConfig)(nil)},
		"nil MigDeviceConfig stays nil": {in: (*MigDeviceConfig)(nil), want: (*MigDeviceConfig)(nil)},
		"GPU Exclusive": {
			in:   &GpuConfig{},
			want: &GpuConfig{Sharing: &GpuSharing{Strategy: ExclusiveStrategy}},
		},
		"MIG Exclusive": {
			in:   &MigDeviceConfig{},
			want: &MigDeviceConfig{Sharing: &MigDeviceSharing{Strategy: ExclusiveStrategy}},
		},
		"empty strategy is not guessed": {
			in:   &GpuConfig{Sharing: &GpuSharing{MPSConfig: &MPSConfig{}}},
			want: &GpuConfig{Sharing: &GpuSharing{MPSConfig: &MPSConfig{}}},
		},
		"TimeSlicing without config": {
			in: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicingStrategy}},
			want: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(DefaultTimeSlice)}}},
		},
		"TimeSlicing with empty config": {
			in: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicingStrategy, TimeSlicingConfig: &TimeSlicingConfig{}}},
			want: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(DefaultTimeSlice)}}},
		},
		"TimeSlicing keeps its interval": {
			in: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(ShortTimeSlice)}}},
			want: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(ShortTimeSlice)}}},
		},
		"TimeSlicing keeps an invalid interval for Validate": {
			in: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(TimeSliceInterval(""))}}},
			want: &GpuConfig{Sharing: &GpuSharing{Strategy: TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(TimeSliceInterval(""))}}},
		},
		"MPS without config leaves limits unset": {
			in: &GpuConfig{Sharing: &GpuSharing{Strategy: MPSStrategy}},
			want: &GpuConfig{Sharing: &GpuSharing{Strategy: MPSStrategy,
				MPSConfig: &MPSConfig{ClientPriority: ptr(NormalMPSClientPriority)}}},
		},
		"MIG MPS without config leaves limits unset": {
			in: &MigDeviceConfig{Sharing: &MigDeviceSharing{Strategy: MPSStrategy}},
			want: &MigDeviceConfig{Sharing: &MigDeviceSharing{Strategy: MPSStrategy,
				MPSConfig: &MPSConfig{ClientPriority: ptr(NormalMPSClientPriority)}}},
		},
		"MIG TimeSlicing needs nothing": {
			in:   &MigDeviceConfig{Sharing: &MigDeviceSharing{Strategy: TimeSlicingStrategy}},
			want: &MigDeviceConfig{Sharing: &MigDeviceSharing{Strategy: TimeSlicingStrategy}},
		},
		"MPS keeps what is set": {
			in: &GpuConfig{Sharing: &GpuSharing{Strategy: MPSStrategy, MPSConfig: &MPSConfig{
				DefaultActiveThreadPercentage:  ptr(10),
				DefaultPinnedDeviceMemoryLimit: ptr(resource.MustParse("2Gi")),
				ClientPriority:                 ptr(BelowNormalMPSClientPriority),
			}}},
			want: &GpuConfig{Sharing: &GpuSharing{Strategy: MPSStrategy, MPSConfig: &MPSConfig{
				DefaultActiveThreadPercentage:  ptr(10),
				DefaultPinnedDeviceMemoryLimit: ptr(resource.MustParse("2Gi")),
				ClientPriority:                 ptr(BelowNormalMPSClientPriority),
			}}},
		},
		"sub-config of another strategy is left for Validate": {
			in: &GpuConfig{Sharing: &GpuSharing{Strategy: MPSStrategy, TimeSlicingConfig: &TimeSlicingConfig{}}},
			want: &GpuConfig{Sharing: &GpuSharing{Strategy: MPSStrategy, TimeSlicingConfig: &TimeSlicingConfig{},
				MPSConfig: &MPSConfig{ClientPriority: ptr(NormalMPSClientPriority)}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.in.Default()
			if diff := cmp.Diff(tc.want, tc.in, cmpQuantities); diff != "" {
				t.Errorf("Default (-want +got):\n%s", diff)
			}
			// Defaulting twice changes nothing.
			again, ok := tc.in.DeepCopyObject().(Config)
			if !ok {
				return // a nil config copies to nil
			}
			again.Default()
			if diff := cmp.Diff(tc.in, again, cmpQuantities); diff != "" {
				t.Errorf("second Default changed the config (-first +second):\n%s", diff)
			}
		})
	}
}

func TestNilSubConfigDefaultsDoNotPanic(t *testing.T) {
	(*GpuSharing)(nil).Default()
	(*MigDeviceSharing)(nil).Default()
	(*TimeSlicingConfig)(nil).Default()
	(*MPSConfig)(nil).Default()
}

func TestDefaultConfigs(t *testing.T) {
	gpu := DefaultGpuConfig()
	if diff := cmp.Diff(&GpuConfig{TypeMeta: gpuTypeMeta, Sharing: &GpuSharing{Strategy: ExclusiveStrategy}}, gpu); diff != "" {
		t.Errorf("DefaultGpuConfig (-want +got):\n%s", diff)
	}
	mig := DefaultMigDeviceConfig()
	if diff := cmp.Diff(&MigDeviceConfig{TypeMeta: migTypeMeta, Sharing: &MigDeviceSharing{Strategy: ExclusiveStrategy}}, mig); diff != "" {
		t.Errorf("DefaultMigDeviceConfig (-want +got):\n%s", diff)
	}
	for _, cfg := range []Config{gpu, mig} {
		if errs := cfg.Validate(); len(errs) > 0 {
			t.Errorf("default %T is invalid: %v", cfg, errs)
		}
	}
}
