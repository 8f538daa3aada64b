package nodelabels

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// cliqueOf is the cliqueID attribute of the first device that has one.
func cliqueOf(t *testing.T, slices []*resourceapi.ResourceSlice) string {
	t.Helper()
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes[vocabulary.AttrCliqueID]; ok {
				return *a.StringValue
			}
		}
	}
	t.Fatal("no device has a cliqueID")
	return ""
}

// setClique copies slices, giving every device of the GPU with minor
// `minor` the clique (nil drops the attribute).
func setClique(in []*resourceapi.ResourceSlice, minor int64, clique *string) []*resourceapi.ResourceSlice {
	out := filterDevices(in, func(*resourceapi.Device) bool { return true })
	for _, s := range out {
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if minorOf(d) != minor {
				continue
			}
			if clique == nil {
				delete(d.Attributes, vocabulary.AttrCliqueID)
			} else {
				d.Attributes[vocabulary.AttrCliqueID] = resourceapi.DeviceAttribute{StringValue: clique}
			}
		}
	}
	return out
}

func TestCliqueLabel(t *testing.T) {
	trayA := simnode.New(t, "gb200nvl72@rack-a", "tray-1").Slices(driver)
	trayB := simnode.New(t, "gb200nvl72@rack-b", "tray-3").Slices(driver)
	cliqueA, cliqueB := cliqueOf(t, trayA), cliqueOf(t, trayB)
	if cliqueA == cliqueB {
		t.Fatalf("racks a and b report the same clique %q", cliqueA)
	}
	l4 := simnode.New(t, "l4x4", "node-a").Slices(driver)

	tests := map[string]struct {
		slices []*resourceapi.ResourceSlice
		want   string // "": no label
	}{
		"tray of rack-a":                           {slices: trayA, want: cliqueA},
		"tray of rack-b":                           {slices: trayB, want: cliqueB},
		"GPUs without a fabric":                    {slices: l4},
		"one GPU without a clique: the rest agree": {slices: setClique(trayA, 0, nil), want: cliqueA},
		"GPUs in two cliques":                      {slices: setClique(trayA, 0, ptr.To(cliqueB))},
		"no GPU reports a clique any more": {slices: filterDevices(trayA, func(d *resourceapi.Device) bool {
			delete(d.Attributes, vocabulary.AttrCliqueID)
			return true
		})},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := Labels(driver, tc.slices)[vocabulary.LabelClique]
			if tc.want == "" && ok {
				t.Errorf("label %s=%q, want none", vocabulary.LabelClique, got)
			}
			if tc.want != "" && got != tc.want {
				t.Errorf("label %s=%q, want %q", vocabulary.LabelClique, got, tc.want)
			}
		})
	}
}
