package opaqueconfig_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/opaqueconfig"
)

const nvidiaTestdata = "../../api/nvidia/v1beta1/testdata"

var (
	gpuMeta = metav1.TypeMeta{APIVersion: "gpu.dra.dev/v1beta1", Kind: "GpuConfig"}
	migMeta = metav1.TypeMeta{APIVersion: "gpu.dra.dev/v1beta1", Kind: "MigDeviceConfig"}
	normal  = ptr.To(gpuv1beta1.NormalMPSClientPriority)
)

func quantity(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }

// NVIDIA's configs become this driver's, defaulted: the strategy and every
// setting carry over, no sharing is Exclusive.
func TestNVIDIAConfigsConvert(t *testing.T) {
	for file, want := range map[string]gpuv1beta1.Config{
		"gpu-time-slicing.yaml": &gpuv1beta1.GpuConfig{TypeMeta: gpuMeta, Sharing: &gpuv1beta1.GpuSharing{
			Strategy:          gpuv1beta1.TimeSlicingStrategy,
			TimeSlicingConfig: &gpuv1beta1.TimeSlicingConfig{Interval: ptr.To(gpuv1beta1.LongTimeSlice)},
		}},
		"gpu-mps.yaml": &gpuv1beta1.GpuConfig{TypeMeta: gpuMeta, Sharing: &gpuv1beta1.GpuSharing{
			Strategy: gpuv1beta1.MPSStrategy,
			MPSConfig: &gpuv1beta1.MPSConfig{
				DefaultActiveThreadPercentage:  ptr.To(50),
				DefaultPinnedDeviceMemoryLimit: quantity("10Gi"),
				ClientPriority:                 normal,
			},
		}},
		"gpu-mps-per-device.json": &gpuv1beta1.GpuConfig{TypeMeta: gpuMeta, Sharing: &gpuv1beta1.GpuSharing{
			Strategy: gpuv1beta1.MPSStrategy,
			MPSConfig: &gpuv1beta1.MPSConfig{
				DefaultPinnedDeviceMemoryLimit: quantity("8Gi"),
				DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{
					"0": resource.MustParse("4Gi"), "GPU-0b8f2d3e-1a2b-4c5d-8e9f-0123456789ab": resource.MustParse("2Gi"),
				},
				ClientPriority: normal,
			},
		}},
		"gpu-no-sharing.json": &gpuv1beta1.GpuConfig{TypeMeta: gpuMeta, Sharing: &gpuv1beta1.GpuSharing{Strategy: gpuv1beta1.ExclusiveStrategy}},
		"mig-mps.yaml": &gpuv1beta1.MigDeviceConfig{TypeMeta: migMeta, Sharing: &gpuv1beta1.MigDeviceSharing{
			Strategy:  gpuv1beta1.MPSStrategy,
			MPSConfig: &gpuv1beta1.MPSConfig{DefaultActiveThreadPercentage: ptr.To(25), ClientPriority: normal},
		}},
		"mig-time-slicing.yaml": &gpuv1beta1.MigDeviceConfig{TypeMeta: migMeta, Sharing: &gpuv1beta1.MigDeviceSharing{Strategy: gpuv1beta1.TimeSlicingStrategy}},
	} {
		t.Run(file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(nvidiaTestdata, file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := opaqueconfig.DecodeDefaultValidate(data)
			if err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("got\n%#v\nwant\n%#v", got, want)
			}
		})
	}
}

// This driver's own configs decode as before, through the same entry point.
func TestDriverConfigsUnchanged(t *testing.T) {
	files, err := filepath.Glob("../../api/gpu/v1beta1/testdata/*.*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		want, err := gpuv1beta1.DecodeDefaultValidate(data)
		if err != nil {
			t.Fatal(err)
		}
		got, err := opaqueconfig.DecodeDefaultValidate(data)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if !equality.Semantic.DeepEqual(got, want) {
			t.Errorf("%s: got %#v, want %#v", file, got, want)
		}
	}
}

const nv = `"apiVersion":"resource.nvidia.com/v1beta1"`

func nvGPU(sharing string) string { return `{` + nv + `,"kind":"GpuConfig","sharing":` + sharing + `}` }
func nvMIG(sharing string) string {
	return `{` + nv + `,"kind":"MigDeviceConfig","sharing":` + sharing + `}`
}

// What NVIDIA's driver would read differently, or what this driver cannot
// do, is refused with the field's path as the user wrote it.
func TestNVIDIAConfigsRejected(t *testing.T) {
	for name, tc := range map[string]struct {
		in   string
		want []string
	}{
		"Exclusive is not NVIDIA's": {
			in:   nvGPU(`{"strategy":"Exclusive"}`),
			want: []string{`sharing.strategy: Unsupported value: "Exclusive": supported values: "TimeSlicing", "MPS"`},
		},
		"strategy missing": {in: nvGPU(`{}`), want: []string{"sharing.strategy: Required value", "leave sharing out for exclusive use"}},
		"clientPriority is not NVIDIA's": {
			in:   nvGPU(`{"strategy":"MPS","mpsConfig":{"clientPriority":"BelowNormal"}}`),
			want: []string{`unknown field "sharing.mpsConfig.clientPriority"`},
		},
		"thread percentage 0, which NVIDIA's accepts": {
			in:   nvGPU(`{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":0}}`),
			want: []string{"sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 0: must be a percentage of the device's threads from 1 to 100"},
		},
		"thread percentage over 100": {
			in:   nvMIG(`{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":101}}`),
			want: []string{"sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 101"},
		},
		"memory limit NVIDIA's would round down": {
			in:   nvGPU(`{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"10G"}}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "10G"`, "use 9536Mi or 9537Mi"},
		},
		"per-device index other than 0": {
			in:   nvGPU(`{"strategy":"MPS","mpsConfig":{"defaultPerDevicePinnedMemoryLimit":{"1":"1Gi"}}}`),
			want: []string{`sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[1]: Invalid value: "1": device index must be 0`},
		},
		"malformed quantity": {
			in:   nvGPU(`{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"ten"}}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "ten": must be a quantity of bytes`},
		},
		"unknown interval": {
			in:   nvGPU(`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"VeryLong"}}`),
			want: []string{`sharing.timeSlicingConfig.interval: Unsupported value: "VeryLong"`},
		},
		"timeSlicingConfig under MPS": {
			in:   nvGPU(`{"strategy":"MPS","timeSlicingConfig":{"interval":"Long"}}`),
			want: []string{`sharing.timeSlicingConfig: Forbidden: may only be set when strategy is "TimeSlicing", not "MPS"`},
		},
		"mpsConfig under TimeSlicing of a MIG device": {
			in:   nvMIG(`{"strategy":"TimeSlicing","mpsConfig":{}}`),
			want: []string{`sharing.mpsConfig: Forbidden`},
		},
		"timeSlicingConfig of a MIG device": {
			in:   nvMIG(`{"strategy":"TimeSlicing","timeSlicingConfig":{}}`),
			want: []string{`unknown field "sharing.timeSlicingConfig"`},
		},
		"duplicate field": {
			in:   `{` + nv + `,"kind":"GpuConfig","sharing":{"strategy":"MPS","strategy":"TimeSlicing"}}`,
			want: []string{`duplicate field "sharing.strategy"`},
		},
		"VFIO": {
			in:   `{` + nv + `,"kind":"VfioDeviceConfig"}`,
			want: []string{"kind: Forbidden: VfioDeviceConfig is not supported by this driver", "VFIO"},
		},
		"ComputeDomain channel": {
			in:   `{` + nv + `,"kind":"ComputeDomainChannelConfig","domainID":"x"}`,
			want: []string{"kind: Forbidden: ComputeDomainChannelConfig is not supported by this driver", "ComputeDomains"},
		},
		"unknown kind": {
			in:   `{` + nv + `,"kind":"TpuConfig"}`,
			want: []string{`kind: Unsupported value: "TpuConfig": supported values: "GpuConfig", "MigDeviceConfig"`},
		},
		"other version": {
			in:   `{"apiVersion":"resource.nvidia.com/v1","kind":"GpuConfig"}`,
			want: []string{`apiVersion: Unsupported value: "resource.nvidia.com/v1": supported values: "gpu.dra.dev/v1beta1", "resource.nvidia.com/v1beta1"`},
		},
		"no apiVersion": {
			in:   `{"kind":"GpuConfig"}`,
			want: []string{`apiVersion: Required value: must be one of "gpu.dra.dev/v1beta1", "resource.nvidia.com/v1beta1"`},
		},
		"YAML": {
			in:   "apiVersion: resource.nvidia.com/v1beta1\nkind: GpuConfig\nsharing:\n  strategy: MPS\n  mpsConfig:\n    defaultActiveThreadPercentage: 200\n",
			want: []string{"sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 200"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := opaqueconfig.DecodeDefaultValidate([]byte(tc.in))
			if err == nil {
				t.Fatalf("accepted as %#v", cfg)
			}
			if cfg != nil {
				t.Errorf("returned %#v along with %v", cfg, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
