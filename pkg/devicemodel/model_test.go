package devicemodel_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// Every simulated machine's slices stay within the ResourceSlice API limits
// the API server enforces.
func TestSlicesWithinAPILimits(t *testing.T) {
	for _, machine := range nvmlsim.Machines() {
		t.Run(machine, func(t *testing.T) {
			n := simnode.New(t, machine, "node-1")
			for _, s := range n.Slices(driverName) {
				if len(s.Spec.SharedCounters) > 0 && len(s.Spec.Devices) > 0 {
					t.Errorf("slice %s mixes counters and devices", s.GenerateName)
				}
				if len(s.Spec.SharedCounters) > resourceapi.ResourceSliceMaxCounterSets {
					t.Errorf("slice %s has %d counter sets", s.GenerateName, len(s.Spec.SharedCounters))
				}
				for _, cs := range s.Spec.SharedCounters {
					if len(cs.Counters) > resourceapi.ResourceSliceMaxCountersPerCounterSet || !dnsLabel.MatchString(cs.Name) {
						t.Errorf("counter set %s: %d counters", cs.Name, len(cs.Counters))
					}
				}
				limit := resourceapi.ResourceSliceMaxDevices
				for _, d := range s.Spec.Devices {
					if len(d.ConsumesCounters) > 0 || d.AllowMultipleAllocations != nil {
						limit = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
					}
				}
				if len(s.Spec.Devices) > limit {
					t.Errorf("slice %s has %d devices, limit %d", s.GenerateName, len(s.Spec.Devices), limit)
				}
				for _, d := range s.Spec.Devices {
					checkDevice(t, d)
				}
			}
		})
	}
}

func checkDevice(t *testing.T, d resourceapi.Device) {
	t.Helper()
	if !dnsLabel.MatchString(d.Name) {
		t.Errorf("device name %q is not a DNS label", d.Name)
	}
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		t.Errorf("%s: %d attributes and capacities", d.Name, n)
	}
	for name, a := range d.Attributes {
		if a.StringValue != nil && len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength {
			t.Errorf("%s: attribute %s is %d characters long", d.Name, name, len(*a.StringValue))
		}
	}
	if len(d.ConsumesCounters) > resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
		t.Errorf("%s consumes %d counter sets", d.Name, len(d.ConsumesCounters))
	}
	for _, c := range d.ConsumesCounters {
		if len(c.Counters) > resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption {
			t.Errorf("%s consumes %d counters", d.Name, len(c.Counters))
		}
	}
	for name, c := range d.Capacity {
		if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations && c.RequestPolicy == nil {
			t.Errorf("%s: shareable capacity %s has no request policy: a share asking for nothing would get all of it", d.Name, name)
		}
	}
}

func deviceNames(res []devicemodel.Published, prefix string) []string {
	var out []string
	for _, p := range res {
		if strings.HasPrefix(p.Device.Name, prefix) {
			out = append(out, p.Device.Name)
		}
	}
	return out
}

func TestPolicy(t *testing.T) {
	n := simnode.New(t, "dgxh100", "node-1")
	off, no := false, false
	policy := devicemodel.Policy{
		Default: devicemodel.GPUPolicy{MPS: &devicemodel.SharePolicy{Enabled: &off}},
		GPUs: map[string]devicemodel.GPUPolicy{
			"0":            {MIG: devicemodel.MIGOff, WholeGPU: &no, TimeSlicing: &devicemodel.SharePolicy{MaxShares: 8}},
			n.GPUs[1].UUID: {MIG: devicemodel.MIGOff},
		},
	}
	if err := policy.Validate(); err != nil {
		t.Fatal(err)
	}
	published, _ := devicemodel.Model(n.GPUs, devicemodel.Options{NodeName: "node-1", Policy: policy})
	if got := deviceNames(published, "gpu-0"); len(got) != 1 || got[0] != "gpu-0-ts" {
		t.Errorf("gpu-0 publishes %v, want only gpu-0-ts", got)
	}
	for _, p := range published {
		if shares := p.Device.Capacity["shares"].Value; p.Device.Name == "gpu-0-ts" && shares.Value() != 8 {
			t.Errorf("gpu-0-ts shares = %v, want 8", shares.String())
		}
		if p.Kind == vocabulary.KindMPS {
			t.Errorf("MPS is off by default but %s is published", p.Device.Name)
		}
	}
	if got := deviceNames(published, "gpu-1-mig"); len(got) != 0 {
		t.Errorf("gpu-1 (MIG off by UUID) publishes MIG devices %v", got)
	}
	if got := deviceNames(published, "gpu-2-mig"); len(got) != 25 {
		t.Errorf("gpu-2 publishes %d MIG devices, want 25", len(got))
	}
	bad := devicemodel.Policy{Default: devicemodel.GPUPolicy{MIG: "sometimes"}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "default.mig") {
		t.Errorf("invalid mig mode: err = %v, want one naming default.mig", err)
	}
}

// migProfiles limits a GPU's dynamic MIG devices to the named profiles (all
// their placements); a per-GPU list replaces the default one, and profiles a
// GPU lacks are skipped.
func TestPolicyMIGProfiles(t *testing.T) {
	n := simnode.New(t, "dgxh100", "node-1")
	policy := devicemodel.Policy{
		Default: devicemodel.GPUPolicy{MIGProfiles: []string{"1g.10gb", "3g.40gb", "1g.5gb"}},
		GPUs:    map[string]devicemodel.GPUPolicy{"1": {MIGProfiles: []string{"7g.80gb"}}},
	}
	if err := policy.Validate(); err != nil {
		t.Fatal(err)
	}
	published, _ := devicemodel.Model(n.GPUs, devicemodel.Options{NodeName: "node-1", Policy: policy})
	count := func(gpu string) map[string]int {
		out := map[string]int{}
		for _, p := range published {
			if p.Kind == vocabulary.KindMIG && p.GPU.CanonicalName() == gpu {
				out[p.MIGProfile.Name]++
			}
		}
		return out
	}
	for gpu, want := range map[string]map[string]int{
		"gpu-0": {"1g.10gb": 7, "3g.40gb": 2}, // 1g.5gb is an A100 profile
		"gpu-1": {"7g.80gb": 1},
	} {
		if got := count(gpu); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s publishes MIG profiles %v, want %v", gpu, got, want)
		}
	}

	// As the chart writes it.
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte("default:\n  migProfiles: [1g.10gb, 3g.40gb]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if loaded, err := devicemodel.LoadPolicy(file); err != nil || fmt.Sprint(loaded.Default.MIGProfiles) != "[1g.10gb 3g.40gb]" {
		t.Errorf("LoadPolicy = %+v, %v", loaded, err)
	}

	for name, tc := range map[string]struct {
		profiles []string
		want     string
	}{
		"not a profile": {[]string{"1g.10gb", "small"}, `default.migProfiles[1]: "small" is not a MIG profile name`},
		"duplicate":     {[]string{"1g.10gb", "1g.10gb"}, `default.migProfiles[1]: "1g.10gb" is listed twice`},
	} {
		bad := devicemodel.Policy{Default: devicemodel.GPUPolicy{MIGProfiles: tc.profiles}}
		if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
}

// MIG instances created out of band make their GPU a static-MIG GPU: it
// publishes exactly those, without counters, and nothing else.
func TestStaticMIG(t *testing.T) {
	n, inst := simnode.WithStaticMIG(t, simnode.New(t, "dgxa100", "node-1"), 3, 9, mig.Placement{Start: 4, Size: 4}) // 3g.20gb
	published, _ := devicemodel.Model(n.GPUs, devicemodel.Options{NodeName: "node-1"})
	got := deviceNames(published, "gpu-3")
	if len(got) != 1 || got[0] != fmt.Sprintf("gpu-3-mig-gi%d-ci%d", inst.GIID, inst.CIID) {
		t.Fatalf("gpu-3 publishes %v, want only its static MIG device", got)
	}
	for _, p := range published {
		if p.Device.Name == got[0] && (p.StaticMIG == nil || len(p.Device.ConsumesCounters) != 0) {
			t.Errorf("static MIG device is not marked static or consumes counters: %+v", p)
		}
	}
	// The instance counts as ours when the checkpoint says so.
	owned := func(parent string, gi uint32) bool { return parent == n.GPUs[3].UUID && gi == inst.GIID }
	published, _ = devicemodel.Model(n.GPUs, devicemodel.Options{NodeName: "node-1", OwnedMIG: owned})
	if got := deviceNames(published, "gpu-3-mig"); len(got) < 10 {
		t.Errorf("with the instance owned, gpu-3 should publish its dynamic model, got %v", got)
	}
}
