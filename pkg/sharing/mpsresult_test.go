package sharing

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// An MPS share's result records the pinned memory limit its clients get,
// for telemetry: the config's (the device's key over the default) over
// the share's memory capacity; none without either.
func TestMPSResultMemoryLimit(t *testing.T) {
	mt := newMPSTest(t, "dgxh100", MPSOptions{})
	gpu := gpuRef(mt.sim, 0)
	tests := map[string]struct {
		share MPSShare
		want  int64
	}{
		"config limit below the capacity": {
			share: MPSShare{Config: &gpuv1beta1.MPSConfig{DefaultPinnedDeviceMemoryLimit: quantity("8Gi")}, Capacity: ShareCapacity{MemoryBytes: 20 << 30}},
			want:  8 << 30,
		},
		"index key over the default": {
			share: MPSShare{Config: &gpuv1beta1.MPSConfig{DefaultPinnedDeviceMemoryLimit: quantity("8Gi"),
				DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{"0": resource.MustParse("6Gi")}}},
			want: 6 << 30,
		},
		"capacity":          {share: MPSShare{Capacity: ShareCapacity{MemoryBytes: 20 << 30}}, want: 20 << 30},
		"neither":           {share: MPSShare{}, want: 0},
		"config without it": {share: MPSShare{Config: &gpuv1beta1.MPSConfig{DefaultActiveThreadPercentage: ptrTo(30)}}, want: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.share.ID = name
			res := mt.acquire(t, gpu, tc.share)
			defer mt.release(t, gpu, name)
			if res.MemoryLimitBytes != tc.want {
				t.Errorf("MemoryLimitBytes = %d, want %d (env %q)", res.MemoryLimitBytes, tc.want, res.Edits.Env)
			}
		})
	}
}
