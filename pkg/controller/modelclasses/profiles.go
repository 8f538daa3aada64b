package modelclasses

import (
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Profiles are the distinct MIG profiles of the MIG devices (dynamic and
// static) in slices of driverName (newest generation of each pool), sorted.
func Profiles(driverName string, in []*resourceapi.ResourceSlice) []string {
	set := map[string]bool{}
	for _, attrs := range currentDevices(driverName, in) {
		typ, profile := attrs[vocabulary.AttrType], attrs[vocabulary.AttrProfile]
		if typ.StringValue != nil && vocabulary.Kind(*typ.StringValue) == vocabulary.KindMIG &&
			profile.StringValue != nil && *profile.StringValue != "" {
			set[*profile.StringValue] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// ProfileDeviceClasses renders, per profile, the class serving the device
// plugin's nvidia.com/mig-<profile> (deviceclass.ProfileClass), labelled as
// managed here; sorted by name.
func ProfileDeviceClasses(driverName string, profiles []string) []*resourceapi.DeviceClass {
	out := make([]*resourceapi.DeviceClass, 0, len(profiles))
	for _, p := range slices.Sorted(slices.Values(profiles)) {
		dc := deviceclass.ProfileClass{Profile: p}.DeviceClass(driverName)
		dc.Labels = map[string]string{ManagedByLabel: ManagedByValue, ModelClassLabel(driverName): "true"}
		out = append(out, dc)
	}
	return out
}
