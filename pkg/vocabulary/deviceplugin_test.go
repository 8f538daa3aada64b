package vocabulary_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Every MIG profile name of pkg/mig's naming gives a valid extended
// resource name, the one the device plugin uses.
func TestMIGResourceName(t *testing.T) {
	for profile, want := range map[string]string{
		"1g.10gb":        "nvidia.com/mig-1g.10gb",
		"1g.10gb+me":     "nvidia.com/mig-1g.10gb.me",
		"1g.10gb+me.all": "nvidia.com/mig-1g.10gb.me.all",
		"7g.80gb":        "nvidia.com/mig-7g.80gb",
	} {
		got := vocabulary.MIGResourceName(profile)
		if got != want {
			t.Errorf("MIGResourceName(%q) = %s, want %s", profile, got, want)
		}
		if errs := validation.IsQualifiedName(got); len(errs) > 0 {
			t.Errorf("MIGResourceName(%q) = %s is no valid resource name: %v", profile, got, errs)
		}
	}
}

func TestIsDevicePluginResource(t *testing.T) {
	for name, want := range map[string]bool{
		"nvidia.com/gpu": true, "nvidia.com/gpu.shared": true, "nvidia.com/mig-1g.10gb": true,
		"nvidia.com/gpus": false, "nvidia.com/mig": false, "example.com/gpu": false, "cpu": false,
	} {
		if got := vocabulary.IsDevicePluginResource(name); got != want {
			t.Errorf("IsDevicePluginResource(%q) = %v, want %v", name, got, want)
		}
	}
}
