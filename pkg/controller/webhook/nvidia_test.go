package webhook

import (
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
			checkCause(t, resp, tc.wantCause)
		})
	}
}

// A valid config that time-slices or MPS-shares a request of the whole-GPU
// class (NVIDIA's quickstart gpu-test5, gpu-test6, gpu-test-mps) is admitted
// with a warning that the plugin refuses it and what serves instead; other
// requests, strategies and operations get none.
func TestWholeGPUSharingWarning(t *testing.T) {
	const nvidiaDriver = "gpu.nvidia.com"
	const sliced = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}}`
	const plain = `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"}`
	withClass := func(c *resourceapi.ResourceClaim, class string) *resourceapi.ResourceClaim {
		c.Spec.Devices.Requests[0].Exactly.DeviceClassName = class
		return c
	}
	for name, tc := range map[string]struct {
		op   admissionv1.Operation
		gvr  metav1.GroupVersionResource
		obj  any
		want []string
	}{
		"claim, whole GPU": {
			op: admissionv1.Create, gvr: claimsGVR, obj: withClass(claim(opaque(nvidiaDriver, sliced, "gpu")), nvidiaDriver),
			want: []string{`spec.devices.config[0].opaque.parameters: sharing strategy "TimeSlicing" for request "gpu" of DeviceClass gpu.nvidia.com, a whole GPU: ` +
				"the kubelet plugin refuses it at prepare. The containers of one claim share a whole GPU without a config; " +
				"to share a GPU between claims or under MPS, request a share from timeslice.gpu.nvidia.com or mps.gpu.nvidia.com"},
		},
		"template, config for all requests": {
			op: admissionv1.Create, gvr: templatesGVR, obj: &resourceapi.ResourceClaimTemplate{
				Spec: resourceapi.ResourceClaimTemplateSpec{Spec: withClass(claim(opaque(nvidiaDriver, sliced)), nvidiaDriver).Spec},
			},
			want: []string{`spec.spec.devices.config[0].opaque.parameters: sharing strategy "TimeSlicing" for request "gpu"`},
		},
		"share class":                {op: admissionv1.Create, gvr: claimsGVR, obj: withClass(claim(opaque(nvidiaDriver, sliced, "gpu")), "timeslice.gpu.nvidia.com")},
		"config for another request": {op: admissionv1.Create, gvr: claimsGVR, obj: withClass(claim(opaque(nvidiaDriver, sliced, "nic")), nvidiaDriver)},
		"no sharing":                 {op: admissionv1.Create, gvr: claimsGVR, obj: withClass(claim(opaque(nvidiaDriver, plain, "gpu")), nvidiaDriver)},
		"update":                     {op: admissionv1.Update, gvr: claimsGVR, obj: withClass(claim(opaque(nvidiaDriver, sliced, "gpu")), nvidiaDriver)},
	} {
		t.Run(name, func(t *testing.T) {
			code, resp, text := post(t, NewHandler(nvidiaDriver, nil), reviewJSON(t, tc.op, tc.gvr, tc.obj, nil))
			if code != http.StatusOK || !resp.Allowed {
				t.Fatalf("HTTP %d, response %+v: %s", code, resp, text)
			}
			if len(resp.Warnings) != len(tc.want) {
				t.Fatalf("warnings %q, want %d", resp.Warnings, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(resp.Warnings[i], w) {
					t.Errorf("warning %q, want it to start with %q", resp.Warnings[i], w)
				}
			}
		})
	}
}
