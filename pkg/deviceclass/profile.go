package deviceclass

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// ProfileClass is the DeviceClass of the MIG devices of one profile. With
// extendedResourceName nvidia.com/mig-<profile> it serves the device
// plugin's "mixed" MIG strategy (docs/migration.md).
type ProfileClass struct {
	// Profile is nvidia-smi's profile name, e.g. "1g.10gb" or "1g.10gb+me".
	Profile string
}

// Name is mig-<profile>.<driver>, e.g. mig-1g.10gb.gpu.dra.dev ('+'
// becomes '.', as in the resource name: object names allow no '+').
func (p ProfileClass) Name(driverName string) string {
	return profileClassName(strings.ReplaceAll(p.Profile, "+", "."), driverName)
}

func profileClassName(suffix, driverName string) string { return "mig-" + suffix + "." + driverName }

// Selector selects MIG devices whose profile attribute is the profile.
func (p ProfileClass) Selector(driverName string) string {
	return Class{DeviceType: vocabulary.KindMIG}.Selector(driverName) +
		fmt.Sprintf(" && device.attributes[%q].%s == %q", driverName, vocabulary.AttrProfile, p.Profile)
}

// Description is the class's description annotation.
func (p ProfileClass) Description() string {
	return profileDescription(p.Profile, vocabulary.MIGResourceName(p.Profile))
}

func profileDescription(profile, resourceName string) string {
	return fmt.Sprintf("A MIG device of profile %s, requested as %s.", profile, resourceName)
}

// DeviceClass renders the class, serving vocabulary.MIGResourceName.
func (p ProfileClass) DeviceClass(driverName string) *resourceapi.DeviceClass {
	name := vocabulary.MIGResourceName(p.Profile)
	return &resourceapi.DeviceClass{
		TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        p.Name(driverName),
			Annotations: map[string]string{vocabulary.AnnotationDescription: p.Description()},
		},
		Spec: resourceapi.DeviceClassSpec{
			Selectors:            []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: p.Selector(driverName)}}},
			ExtendedResourceName: &name,
		},
	}
}
