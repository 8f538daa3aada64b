package modelclasses

import (
	"context"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"

	"github.com/gpu-dra/gpu-dra-driver/internal/simnode"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Each profile class's selector, evaluated as the scheduler does against
// every device of two simulated machines, selects exactly the MIG devices
// of its profile, and serves the device plugin's name for it.
func TestProfileClassesSelectTheirProfile(t *testing.T) {
	var all []*resourceapi.ResourceSlice
	for _, m := range []string{"dgxh100", "dgxa100"} {
		all = append(all, simnode.New(t, m, "node-"+m).Slices(driver)...)
	}
	profiles := Profiles(driver, all)
	for _, p := range []string{"1g.10gb", "1g.10gb+me", "7g.80gb", "1g.5gb", "7g.40gb"} {
		if !slices.Contains(profiles, p) {
			t.Errorf("profiles %q lack %s", profiles, p)
		}
	}
	compiler := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true})
	for _, dc := range ProfileDeviceClasses(driver, profiles) {
		profile := ""
		for _, p := range profiles {
			if dc.Spec.ExtendedResourceName != nil && *dc.Spec.ExtendedResourceName == vocabulary.MIGResourceName(p) {
				profile = p
			}
		}
		if profile == "" || dc.Labels[ModelClassLabel(driver)] != "true" {
			t.Fatalf("class %s: extended resource %v, labels %v", dc.Name, dc.Spec.ExtendedResourceName, dc.Labels)
		}
		prog := compiler.CompileCELExpression(dc.Spec.Selectors[0].CEL.Expression, dracel.Options{})
		if prog.Error != nil {
			t.Fatalf("class %s: %v", dc.Name, prog.Error)
		}
		matched := 0
		for _, s := range all {
			for _, d := range s.Spec.Devices {
				ok, _, err := prog.DeviceMatches(context.Background(), dracel.Device{
					Driver: driver, Attributes: d.Attributes, Capacity: d.Capacity, AllowMultipleAllocations: d.AllowMultipleAllocations,
				})
				if err != nil {
					t.Fatalf("class %s on %s: %v", dc.Name, d.Name, err)
				}
				p := d.Attributes[vocabulary.AttrProfile].StringValue
				want := *d.Attributes[vocabulary.AttrType].StringValue == string(vocabulary.KindMIG) && p != nil && *p == profile
				if ok != want {
					t.Errorf("class %s on %s: matches %v, want %v", dc.Name, d.Name, ok, want)
				}
				if ok {
					matched++
				}
			}
		}
		if matched == 0 {
			t.Errorf("class %s matches no device", dc.Name)
		}
	}
}

// With MIGProfiles alone the controller keeps one class per published
// profile and no model classes; classes of the same name it did not make
// (the chart's extendedResources.migProfiles) are left alone.
func TestSyncMIGProfiles(t *testing.T) {
	chart := ProfileDeviceClasses(driver, []string{"1g.10gb"})[0]
	chart.Labels = nil
	e := setupWith(t, Options{DriverName: driver, MIGProfiles: true}, chart)
	e.publish(t, "dgxh100", "node-a")
	n, _ := e.c.slices.List(everything)
	e.sync(t, len(n))
	names := e.classNames(t)
	for _, want := range []string{"mig-1g.10gb.gpu.dra.dev", "mig-1g.10gb.me.gpu.dra.dev", "mig-7g.80gb.gpu.dra.dev"} {
		if !slices.Contains(names, want) {
			t.Errorf("classes %v lack %s", names, want)
		}
	}
	if slices.Contains(names, "nvidia-h100-80gb-hbm3.gpu.dra.dev") {
		t.Errorf("model class made without Models: %v", names)
	}
	got, err := e.client.ResourceV1().DeviceClasses().Get(e.ctx, chart.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels[ModelClassLabel(driver)] == "true" {
		t.Errorf("the chart's class %s was taken over: labels %v", chart.Name, got.Labels)
	}
}

func TestNewNeedsAKind(t *testing.T) {
	if _, err := New(nil, nil, nil, Options{DriverName: driver}); err == nil {
		t.Fatal("New without Models or MIGProfiles succeeded")
	}
}
