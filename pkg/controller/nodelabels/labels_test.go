package nodelabels

import (
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

const driver = "gpu.dra.dev"

func TestMain(m *testing.M) { os.Exit(simnode.Main(m)) }

// gfd are the labels GFD writes for a node of the machine with default
// sharing (both strategies published, MPS reported as GFD prefers it).
func gfd(product, memory, count, family, major, minor, migCapable string) map[string]string {
	return map[string]string{
		"nvidia.com/gpu.present":                  "true",
		"gpu.dra.dev/driver":                      "true",
		"nvidia.com/gpu.product":                  product,
		"nvidia.com/gpu.memory":                   memory,
		"nvidia.com/gpu.count":                    count,
		"nvidia.com/gpu.family":                   family,
		"nvidia.com/gpu.compute.major":            major,
		"nvidia.com/gpu.compute.minor":            minor,
		"nvidia.com/gpu.sharing-strategy":         "mps",
		"nvidia.com/gpu.replicas":                 "4",
		"nvidia.com/mig.capable":                  migCapable,
		"nvidia.com/mps.capable":                  "true",
		"nvidia.com/cuda.driver-version.major":    "550",
		"nvidia.com/cuda.driver-version.minor":    "54",
		"nvidia.com/cuda.driver-version.revision": "15",
		"nvidia.com/cuda.driver-version.full":     "550.54.15",
		"nvidia.com/cuda.runtime-version.major":   "12",
		"nvidia.com/cuda.runtime-version.minor":   "4",
		"nvidia.com/cuda.runtime-version.full":    "12.4",
		"nvidia.com/cuda.driver.major":            "550",
		"nvidia.com/cuda.driver.minor":            "54",
		"nvidia.com/cuda.driver.rev":              "15",
		"nvidia.com/cuda.runtime.major":           "12",
		"nvidia.com/cuda.runtime.minor":           "4",
	}
}

func TestLabelsOfSimulatedMachines(t *testing.T) {
	tests := map[string]map[string]string{
		"dgxh100": gfd("NVIDIA-H100-80GB-HBM3", "81559", "8", "hopper", "9", "0", "true"),
		"dgxa100": gfd("NVIDIA-A100-SXM4-40GB", "40960", "8", "ampere", "8", "0", "true"),
		"l4x4":    gfd("NVIDIA-L4", "23034", "4", "ada-lovelace", "8", "9", "false"),
	}
	for machine, want := range tests {
		t.Run(machine, func(t *testing.T) {
			slices := simnode.New(t, machine, "node-a").Slices(driver)
			if machine == "dgxh100" { // NVSwitch: one NVLink clique
				want[vocabulary.LabelClique] = cliqueOf(t, slices)
			}
			if diff := cmp.Diff(want, Labels(driver, slices)); diff != "" {
				t.Errorf("labels (-want +got):\n%s", diff)
			}
		})
	}
}

// filterDevices copies slices keeping only the devices keep accepts.
func filterDevices(in []*resourceapi.ResourceSlice, keep func(*resourceapi.Device) bool) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for _, s := range in {
		s = s.DeepCopy()
		var devs []resourceapi.Device
		for i := range s.Spec.Devices {
			if keep(&s.Spec.Devices[i]) {
				devs = append(devs, s.Spec.Devices[i])
			}
		}
		s.Spec.Devices = devs
		out = append(out, s)
	}
	return out
}

func deviceType(d *resourceapi.Device) vocabulary.Kind {
	return vocabulary.Kind(*d.Attributes[vocabulary.AttrType].StringValue)
}

func minorOf(d *resourceapi.Device) int64 {
	for _, name := range []resourceapi.QualifiedName{vocabulary.AttrMinor, vocabulary.AttrParentMinor} {
		if a, ok := d.Attributes[name]; ok {
			return *a.IntValue
		}
	}
	return -1
}

func TestLabelsFollowPublishedDevices(t *testing.T) {
	h100 := simnode.New(t, "dgxh100", "node-a").Slices(driver)
	l4 := simnode.New(t, "l4x4", "node-a").Slices(driver)
	a100 := simnode.New(t, "dgxa100", "node-a").Slices(driver)

	tests := map[string]struct {
		slices []*resourceapi.ResourceSlice
		want   map[string]string // the labels that differ from dgxh100's
		gone   []string          // labels that are absent
	}{
		"no whole GPUs: count and memory from the shares": {
			slices: filterDevices(h100, func(d *resourceapi.Device) bool { return deviceType(d) != vocabulary.KindGPU }),
			want:   map[string]string{},
		},
		"time-slicing only": {
			slices: filterDevices(h100, func(d *resourceapi.Device) bool { return deviceType(d) != vocabulary.KindMPS }),
			want: map[string]string{
				"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/mps.capable": "false",
			},
		},
		"no shares": {
			slices: filterDevices(h100, func(d *resourceapi.Device) bool {
				return deviceType(d) != vocabulary.KindMPS && deviceType(d) != vocabulary.KindTimeSlice
			}),
			want: map[string]string{
				"nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/gpu.replicas": "1", "nvidia.com/mps.capable": "false",
			},
		},
		"MIG devices only: no memory label": {
			slices: filterDevices(h100, func(d *resourceapi.Device) bool { return deviceType(d) == vocabulary.KindMIG }),
			want: map[string]string{
				"nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/gpu.replicas": "1", "nvidia.com/mps.capable": "false",
			},
			gone: []string{"nvidia.com/gpu.memory"},
		},
		"fewer GPUs published": {
			slices: filterDevices(h100, func(d *resourceapi.Device) bool { return minorOf(d) < 3 }),
			want:   map[string]string{"nvidia.com/gpu.count": "3"},
		},
		"an older pool generation is ignored": {
			slices: append(olderGeneration(l4), h100...),
			want:   map[string]string{},
		},
		"another driver's slices are ignored": {
			slices: append(otherDriver(l4), h100...),
			want:   map[string]string{},
		},
		"mixed models: the most numerous model is labelled": {
			slices: append(append([]*resourceapi.ResourceSlice{}, l4...), h100...),
			want:   map[string]string{},
		},
		"mixed models: node-wide MIG capability from the other model": {
			slices: append(append([]*resourceapi.ResourceSlice{}, l4...),
				filterDevices(a100, func(d *resourceapi.Device) bool { return minorOf(d) < 3 })...),
			want: map[string]string{
				"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.memory": "23034", "nvidia.com/gpu.count": "4",
				"nvidia.com/gpu.family": "ada-lovelace", "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "9",
				"nvidia.com/mig.capable": "true",
			},
			gone: []string{vocabulary.LabelClique}, // neither model has an NVLink fabric
		},
		"mixed models, tie: the smaller product name": {
			slices: append(filterDevices(a100, func(d *resourceapi.Device) bool { return minorOf(d) < 4 }), l4...),
			want: map[string]string{
				"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.memory": "40960", "nvidia.com/gpu.count": "4",
				"nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "0",
			},
			gone: []string{vocabulary.LabelClique},
		},
	}
	base := Labels(driver, h100)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			want := map[string]string{}
			for k, v := range base {
				want[k] = v
			}
			for k, v := range tc.want {
				want[k] = v
			}
			for _, k := range tc.gone {
				delete(want, k)
			}
			if diff := cmp.Diff(want, Labels(driver, tc.slices)); diff != "" {
				t.Errorf("labels (-want +got):\n%s", diff)
			}
		})
	}
}

func olderGeneration(in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for _, s := range in {
		s = s.DeepCopy()
		s.Spec.Pool.Generation = 0
		out = append(out, s)
	}
	return out
}

func otherDriver(in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for _, s := range in {
		s = s.DeepCopy()
		s.Spec.Driver = "other.example.com"
		out = append(out, s)
	}
	return out
}

func TestLabelsWithoutGPUs(t *testing.T) {
	if got := Labels(driver, nil); len(got) != 0 {
		t.Errorf("labels without slices: %v", got)
	}
	counters := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{
		Driver: driver, Pool: resourceapi.ResourcePool{Name: "n", Generation: 1},
		SharedCounters: []resourceapi.CounterSet{{Name: "gpu-0"}},
	}}
	if got := Labels(driver, []*resourceapi.ResourceSlice{counters}); len(got) != 0 {
		t.Errorf("labels of a counter-only slice: %v", got)
	}
}

func TestDriverVersion(t *testing.T) {
	tests := map[string]struct {
		attr              resourceapi.DeviceAttribute
		major, minor, rev string
		ok                bool
	}{
		"semver, two-digit revision":   {attr: resourceapi.DeviceAttribute{VersionValue: ptr.To("550.54.15")}, major: "550", minor: "54", rev: "15", ok: true},
		"semver, leading zero dropped": {attr: resourceapi.DeviceAttribute{VersionValue: ptr.To("535.104.5")}, major: "535", minor: "104", rev: "05", ok: true},
		"string, as published":         {attr: resourceapi.DeviceAttribute{StringValue: ptr.To("396.26")}, major: "396", minor: "26", rev: "", ok: true},
		"string, three parts":          {attr: resourceapi.DeviceAttribute{StringValue: ptr.To("418.87.00")}, major: "418", minor: "87", rev: "00", ok: true},
		"unusable":                     {attr: resourceapi.DeviceAttribute{StringValue: ptr.To("unknown")}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			major, minor, rev, ok := driverVersion(&tc.attr)
			if major != tc.major || minor != tc.minor || rev != tc.rev || ok != tc.ok {
				t.Errorf("got %q %q %q %v, want %q %q %q %v", major, minor, rev, ok, tc.major, tc.minor, tc.rev, tc.ok)
			}
		})
	}
}

func TestProductLabelValue(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA H100 80GB HBM3":           "NVIDIA-H100-80GB-HBM3",
		"NVIDIA A100-SXM4-40GB":           "NVIDIA-A100-SXM4-40GB",
		"NVIDIA  GeForce RTX 4090 (test)": "NVIDIA-GeForce-RTX-4090-test",
		"Tesla V100-SXM2-16GB":            "Tesla-V100-SXM2-16GB",
		"NVIDIA RTX PRO 6000 Blackwell Server Edition with an unusually long name": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition-with-an-unusually",
	} {
		if got := ProductLabelValue(in); got != want {
			t.Errorf("ProductLabelValue(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFamily(t *testing.T) {
	for _, c := range []struct{ major, minor, arch, want string }{
		{"7", "0", "Volta", "volta"}, {"7", "5", "Turing", "turing"},
		{"8", "0", "Ampere", "ampere"}, {"8", "6", "Ampere", "ampere"}, {"8", "9", "Ada Lovelace", "ada-lovelace"},
		{"9", "0", "Hopper", "hopper"}, {"10", "0", "Blackwell", "blackwell"}, {"12", "0", "Blackwell", "blackwell"},
		{"11", "0", "Some Future", "some-future"}, {"42", "0", "", "undefined"},
	} {
		if got := family(c.major, c.minor, c.arch); got != c.want {
			t.Errorf("family(%s.%s, %q) = %q, want %q", c.major, c.minor, c.arch, got, c.want)
		}
	}
}
