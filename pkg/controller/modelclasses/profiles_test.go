package modelclasses

import (
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
		checkSelects(t, dc, all, func(d resourceapi.Device) bool {
			p := d.Attributes[vocabulary.AttrProfile].StringValue
			return *d.Attributes[vocabulary.AttrType].StringValue == string(vocabulary.KindMIG) && p != nil && *p == profile
		})
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
	// The count comes from the API server: the informer may not have
	// seen every slice yet (it saw 8 of 9 once, and the test failed).
	n, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.sync(t, len(n.Items))
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
