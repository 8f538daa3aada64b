package webhook

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/opaqueconfig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// The requests of a claim's devices, as far as the warning below reads them.
type requestShape struct {
	Name    string `json:"name"`
	Exactly *struct {
		DeviceClassName string `json:"deviceClassName"`
	} `json:"exactly"`
	FirstAvailable []struct {
		Name            string `json:"name"`
		DeviceClassName string `json:"deviceClassName"`
	} `json:"firstAvailable"`
}

type devicesShape struct {
	Requests []requestShape `json:"requests"`
	Config   []struct {
		Requests []string      `json:"requests"`
		Opaque   *opaqueConfig `json:"opaque"`
	} `json:"config"`
}

// devicesOf finds spec.devices of a claim or spec.spec.devices of a
// template, with the path of its configs; nil for other resources.
func devicesOf(resource string, raw []byte) (*devicesShape, *field.Path) {
	switch resource {
	case "resourceclaims":
		var obj struct {
			Spec struct {
				Devices devicesShape `json:"devices"`
			} `json:"spec"`
		}
		if json.Unmarshal(raw, &obj) == nil {
			return &obj.Spec.Devices, field.NewPath("spec", "devices", "config")
		}
	case "resourceclaimtemplates":
		var obj struct {
			Spec struct {
				Spec struct {
					Devices devicesShape `json:"devices"`
				} `json:"spec"`
			} `json:"spec"`
		}
		if json.Unmarshal(raw, &obj) == nil {
			return &obj.Spec.Spec.Devices, field.NewPath("spec", "spec", "devices", "config")
		}
	}
	return nil, nil
}

// wholeGPUSharingWarnings warns about valid GpuConfigs that ask for
// time-slicing or MPS on a request of the whole-GPU DeviceClass (the one
// named as the driver): NVIDIA's driver shares such a GPU between the
// containers of the claim, the kubelet plugin refuses it at prepare
// (docs/migration.md). A warning, not a denial: whether the config reaches
// a whole GPU depends on classes the webhook does not read (a per-model
// class is a whole GPU too, a config may name no request).
func wholeGPUSharingWarnings(driverName, resource string, raw []byte) []string {
	devices, path := devicesOf(resource, raw)
	if devices == nil {
		return nil
	}
	var warnings []string
	for i, c := range devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != driverName {
			continue
		}
		cfg, err := opaqueconfig.DecodeDefaultValidate(c.Opaque.Parameters)
		gpu, ok := cfg.(*gpuv1beta1.GpuConfig)
		if err != nil || !ok || gpu.Sharing.Strategy == gpuv1beta1.ExclusiveStrategy {
			continue
		}
		for _, request := range wholeGPURequests(driverName, devices.Requests, c.Requests) {
			warnings = append(warnings, fmt.Sprintf(
				"%s: sharing strategy %q for request %q of DeviceClass %s, a whole GPU: the kubelet plugin refuses it at prepare. "+
					"The containers of one claim share a whole GPU without a config; to share a GPU between claims or under MPS, "+
					"request a share from timeslice.%s or mps.%s",
				path.Index(i).Child("opaque", "parameters"), gpu.Sharing.Strategy, request, driverName, driverName, driverName))
		}
	}
	return warnings
}

// wholeGPURequests are the requests (and subrequests) a config naming
// configRequests applies to that ask for the whole-GPU class.
func wholeGPURequests(driverName string, requests []requestShape, configRequests []string) []string {
	var out []string
	for _, r := range requests {
		if r.Exactly != nil && r.Exactly.DeviceClassName == driverName && vocabulary.AppliesTo(configRequests, r.Name) {
			out = append(out, r.Name)
		}
		for _, sub := range r.FirstAvailable {
			name := r.Name + "/" + sub.Name
			if sub.DeviceClassName == driverName && vocabulary.AppliesTo(configRequests, name) {
				out = append(out, name)
			}
		}
	}
	return out
}
