package nodeplugin

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// attrKind is the value field a DeviceAttribute must use.
type attrKind int

const (
	stringValue attrKind = iota
	intValue
	boolValue
	versionValue
)

// nvidiaAttributes is what NVIDIA's DRA driver publishes, and so what its
// users' CEL and NVIDIA's tools (dcgm-exporter's DRA mapping) read, per
// device type: name and value type (cmd/gpu-kubelet-plugin deviceinfo.go
// and mig.go of k8s-dra-driver-gpu; index and minor from its earlier
// releases, which its quickstart's selectors still use). The
// resource.kubernetes.io names are the standard attributes both publish.
var nvidiaAttributes = map[string]map[resourceapi.QualifiedName]attrKind{
	"gpu": {
		"type": stringValue, "uuid": stringValue, "productName": stringValue, "brand": stringValue,
		"architecture": stringValue, "cudaComputeCapability": versionValue, "driverVersion": versionValue,
		"cudaDriverVersion": versionValue, "index": intValue, "minor": intValue,
		"resource.kubernetes.io/pciBusID": stringValue,
	},
	"mig": {
		"type": stringValue, "parentUUID": stringValue, "profile": stringValue, "productName": stringValue,
		"brand": stringValue, "architecture": stringValue, "cudaComputeCapability": versionValue,
		"driverVersion": versionValue, "cudaDriverVersion": versionValue,
		"resource.kubernetes.io/pciBusID": stringValue,
	},
}

// ownAttributes are this driver's attributes beyond NVIDIA's, which the
// profile keeps: MIG placements, the parent's minor, MIG state.
var ownAttributes = map[string][]resourceapi.QualifiedName{
	"gpu": {"migCapable", "migEnabled"},
	"mig": {"placementStart", "parentMinor"},
}

// NVIDIA's capacities of a MIG device (CommonCapacitiesMig) and a GPU.
var nvidiaCapacities = map[string][]resourceapi.QualifiedName{
	"gpu": {"memory"},
	"mig": {"memory", "multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines"},
}

// semver is a version as NVIDIA's driver formats one
// (semver.MustParse(v).String()): three parts, no leading zeros.
var semver = regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`)

func renderSlices(t *testing.T, driver, machine string) ([]byte, []resourceapi.ResourceSlice) {
	t.Helper()
	var out bytes.Buffer
	cfg := &Config{
		DriverName: driver, NodeName: "node-1", Simulate: machine,
		PrintSlices: true, PluginDataDir: t.TempDir(), Out: &out, MPSControl: "/bin/true",
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("Run: %v", err)
	}
	var slices []resourceapi.ResourceSlice
	for _, doc := range strings.Split(out.String(), "---\n")[1:] {
		var s resourceapi.ResourceSlice
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			t.Fatal(err)
		}
		slices = append(slices, s)
	}
	return out.Bytes(), slices
}

// Under NVIDIA's driver name every simulated machine publishes, for each
// whole GPU and MIG device, the attributes NVIDIA's driver publishes, under
// that driver, with NVIDIA's value types and version format, beside this
// driver's own; shares keep their own type and the GPU's identity.
func TestNVIDIACompatAttributes(t *testing.T) {
	for _, machine := range nvmlsim.Machines() {
		t.Run(machine, func(t *testing.T) {
			_, slices := renderSlices(t, vocabulary.NVIDIADriverName, machine)
			seen := map[string]int{}
			for _, s := range slices {
				if s.Spec.Driver != vocabulary.NVIDIADriverName {
					t.Fatalf("slice of driver %s", s.Spec.Driver)
				}
				for _, d := range s.Spec.Devices {
					typ := d.Attributes["type"].StringValue
					if typ == nil {
						t.Fatalf("device %s has no string type", d.Name)
					}
					seen[*typ]++
					want, ok := nvidiaAttributes[*typ]
					if !ok {
						// Shares: no NVIDIA counterpart; dcgm-exporter's
						// mapping goes by their GPU's uuid.
						if d.Attributes["uuid"].StringValue == nil {
							t.Errorf("%s device %s has no uuid", *typ, d.Name)
						}
						continue
					}
					checkAttributes(t, d, want)
					for _, name := range ownAttributes[*typ] {
						if _, ok := d.Attributes[name]; !ok {
							t.Errorf("%s device %s lost this driver's attribute %s", *typ, d.Name, name)
						}
					}
					for _, name := range nvidiaCapacities[*typ] {
						if _, ok := d.Capacity[name]; !ok {
							t.Errorf("%s device %s lacks NVIDIA's capacity %s", *typ, d.Name, name)
						}
					}
				}
			}
			if seen["gpu"] == 0 {
				t.Errorf("no whole GPUs published: %v", seen)
			}
		})
	}
}

func checkAttributes(t *testing.T, d resourceapi.Device, want map[resourceapi.QualifiedName]attrKind) {
	t.Helper()
	for name, kind := range want {
		a, ok := d.Attributes[name]
		if !ok {
			t.Errorf("device %s lacks NVIDIA's attribute %s", d.Name, name)
			continue
		}
		switch kind {
		case stringValue:
			if a.StringValue == nil || *a.StringValue == "" {
				t.Errorf("device %s: %s = %+v, want a string", d.Name, name, a)
			}
		case intValue:
			if a.IntValue == nil {
				t.Errorf("device %s: %s = %+v, want an int", d.Name, name, a)
			}
		case versionValue:
			if a.VersionValue == nil || !semver.MatchString(*a.VersionValue) {
				t.Errorf("device %s: %s = %+v, want a version like 12.4.0", d.Name, name, a)
			}
		}
	}
}

// Under NVIDIA's driver name the slices are this driver's, device for
// device and attribute for attribute, with only the driver name (and so
// the attribute domain) changed: nothing of the model (MIG placements,
// shares, counters, NVLink domains) is lost to the profile.
func TestNVIDIACompatKeepsModel(t *testing.T) {
	for _, machine := range nvmlsim.Machines() {
		t.Run(machine, func(t *testing.T) {
			own, _ := renderSlices(t, vocabulary.DriverName, machine)
			nvidia, _ := renderSlices(t, vocabulary.NVIDIADriverName, machine)
			want := strings.ReplaceAll(string(own), vocabulary.DriverName, vocabulary.NVIDIADriverName)
			if diff := cmp.Diff(want, string(nvidia)); diff != "" {
				t.Errorf("slices under %s differ from this driver's beyond the name (-want +got):\n%s", vocabulary.NVIDIADriverName, diff)
			}
		})
	}
}
