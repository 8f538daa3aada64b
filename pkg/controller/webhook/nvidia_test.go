package webhook

import (
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// Under NVIDIA's driver name (the chart's compat.nvidia profile) the webhook
// admits NVIDIA's configs as the plugin will apply them, and denies what the
// plugin would refuse, with the path of the field as written.
func TestAdmissionNVIDIAConfigs(t *testing.T) {
	const nvidiaDriver = "gpu.nvidia.com"
	const nv = `{"apiVersion":"resource.nvidia.com/v1beta1",`
	for name, tc := range map[string]struct {
		params    string
		wantCause string // "" means allowed
		wantParts []string
	}{
		"quickstart time-slicing": {
			params: nv + `"kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`,
		},
		"quickstart MPS": {
			params: nv + `"kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"10Gi"}}}`,
		},
		"MIG MPS": {params: nv + `"kind":"MigDeviceConfig","sharing":{"strategy":"MPS"}}`},
		"this driver's own API under NVIDIA's name": {
			params: `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"clientPriority":"BelowNormal"}}}`,
		},
		"thread percentage 0": {
			params:    nv + `"kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":0}}}`,
			wantCause: "spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage",
			wantParts: []string{"spec.devices.config[0].opaque.parameters: sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 0"},
		},
		"Exclusive": {
			params:    nv + `"kind":"GpuConfig","sharing":{"strategy":"Exclusive"}}`,
			wantCause: "spec.devices.config[0].opaque.parameters.sharing.strategy",
			wantParts: []string{`sharing.strategy: Unsupported value: "Exclusive"`},
		},
		"VFIO": {
			params:    nv + `"kind":"VfioDeviceConfig"}`,
			wantCause: "spec.devices.config[0].opaque.parameters.kind",
			wantParts: []string{"VfioDeviceConfig is not supported by this driver"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			body := reviewJSON(t, admissionv1.Create, claimsGVR, claim(opaque(nvidiaDriver, tc.params, "gpu")), nil)
			code, resp, text := post(t, NewHandler(nvidiaDriver, nil), body)
			if code != http.StatusOK {
				t.Fatalf("HTTP %d: %s", code, text)
			}
			if want := tc.wantCause == ""; resp.Allowed != want {
				t.Fatalf("allowed = %v, want %v (result %+v)", resp.Allowed, want, resp.Result)
			}
			if resp.Allowed {
				return
			}
			for _, part := range tc.wantParts {
				if !strings.Contains(resp.Result.Message, part) {
					t.Errorf("message %q does not contain %q", resp.Result.Message, part)
				}
			}
			found := false
			for _, c := range resp.Result.Details.Causes {
				found = found || c.Field == tc.wantCause
			}
			if !found {
				t.Errorf("causes %+v lack field %q", resp.Result.Details.Causes, tc.wantCause)
			}
		})
	}
}
