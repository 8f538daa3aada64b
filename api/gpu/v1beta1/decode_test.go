package v1beta1

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func ptr[T any](v T) *T { return &v }

var (
	gpuTypeMeta = metav1.TypeMeta{APIVersion: "gpu.dra.dev/v1beta1", Kind: "GpuConfig"}
	migTypeMeta = metav1.TypeMeta{APIVersion: "gpu.dra.dev/v1beta1", Kind: "MigDeviceConfig"}
)

// cmpQuantities compares quantities by value, not by their cached string.
var cmpQuantities = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestDecodeDefaultValidateExamples decodes the documented examples under
// testdata/ and checks the defaulted result.
func TestDecodeDefaultValidateExamples(t *testing.T) {
	tests := map[string]Config{
		"gpu-exclusive.yaml": &GpuConfig{
			TypeMeta: gpuTypeMeta,
			Sharing:  &GpuSharing{Strategy: ExclusiveStrategy},
		},
		"gpu-time-slicing.yaml": &GpuConfig{
			TypeMeta: gpuTypeMeta,
			Sharing: &GpuSharing{
				Strategy:          TimeSlicingStrategy,
				TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(LongTimeSlice)},
			},
		},
		"gpu-mps.yaml": &GpuConfig{
			TypeMeta: gpuTypeMeta,
			Sharing: &GpuSharing{
				Strategy: MPSStrategy,
				MPSConfig: &MPSConfig{
					DefaultActiveThreadPercentage:  ptr(50),
					DefaultPinnedDeviceMemoryLimit: ptr(resource.MustParse("8Gi")),
					DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{
						"0": resource.MustParse("16Gi"),
						"GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c": resource.MustParse("12Gi"),
					},
					ClientPriority: ptr(BelowNormalMPSClientPriority),
				},
			},
		},
		"gpu-mps-defaults.json": &GpuConfig{
			TypeMeta: gpuTypeMeta,
			Sharing: &GpuSharing{
				Strategy:  MPSStrategy,
				MPSConfig: &MPSConfig{ClientPriority: ptr(NormalMPSClientPriority)},
			},
		},
		"mig-exclusive.json": &MigDeviceConfig{
			TypeMeta: migTypeMeta,
			Sharing:  &MigDeviceSharing{Strategy: ExclusiveStrategy},
		},
		"mig-time-slicing.yaml": &MigDeviceConfig{
			TypeMeta: migTypeMeta,
			Sharing:  &MigDeviceSharing{Strategy: TimeSlicingStrategy},
		},
		"mig-mps.yaml": &MigDeviceConfig{
			TypeMeta: migTypeMeta,
			Sharing: &MigDeviceSharing{
				Strategy: MPSStrategy,
				MPSConfig: &MPSConfig{
					DefaultActiveThreadPercentage: ptr(25),
					DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{
						"MIG-9a7c1c4e-7d2b-5f37-a1b0-0c5a3e2f6d11": resource.MustParse("4Gi"),
					},
					ClientPriority: ptr(NormalMPSClientPriority),
				},
			},
		},
	}
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			if _, ok := tests[e.Name()]; !ok {
				t.Errorf("testdata/%s has no expectation in this test", e.Name())
			}
		}
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeDefaultValidate(readTestdata(t, name))
			if err != nil {
				t.Fatalf("DecodeDefaultValidate: %v", err)
			}
			if diff := cmp.Diff(want, got, cmpQuantities); diff != "" {
				t.Errorf("decoded config (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDecodeDefaultValidateJSONAndYAMLAgree checks that a config decodes to
// the same object whether written as JSON or YAML, including an unquoted
// index key, which YAML reads as a number.
func TestDecodeDefaultValidateJSONAndYAMLAgree(t *testing.T) {
	yamlDoc := `
apiVersion: gpu.dra.dev/v1beta1
kind: GpuConfig
sharing:
  strategy: MPS
  mpsConfig:
    defaultActiveThreadPercentage: 30
    defaultPerDevicePinnedMemoryLimit:
      0: 1Gi
      GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c: 2Gi
`
	jsonDoc := `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{
		"defaultActiveThreadPercentage":30,"defaultPerDevicePinnedMemoryLimit":{"0":"1Gi","GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c":"2Gi"}}}}`
	fromYAML, err := DecodeDefaultValidate([]byte(yamlDoc))
	if err != nil {
		t.Fatalf("YAML: %v", err)
	}
	fromJSON, err := DecodeDefaultValidate([]byte(jsonDoc))
	if err != nil {
		t.Fatalf("JSON: %v", err)
	}
	if diff := cmp.Diff(fromJSON, fromYAML, cmpQuantities); diff != "" {
		t.Errorf("YAML and JSON decode differently (-json +yaml):\n%s", diff)
	}
}

func TestDecodeDefaultValidateDefaults(t *testing.T) {
	tests := map[string]struct {
		in   string
		want Config
	}{
		"no sharing is Exclusive": {
			in:   `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig"}`,
			want: &GpuConfig{TypeMeta: gpuTypeMeta, Sharing: &GpuSharing{Strategy: ExclusiveStrategy}},
		},
		"null sharing is Exclusive": {
			in:   `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":null}`,
			want: &GpuConfig{TypeMeta: gpuTypeMeta, Sharing: &GpuSharing{Strategy: ExclusiveStrategy}},
		},
		"null MIG sharing is Exclusive": {
			in:   "apiVersion: gpu.dra.dev/v1beta1\nkind: MigDeviceConfig\nsharing: null\n",
			want: &MigDeviceConfig{TypeMeta: migTypeMeta, Sharing: &MigDeviceSharing{Strategy: ExclusiveStrategy}},
		},
		"empty timeSlicingConfig gets interval Default": {
			in: "apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\nsharing:\n  strategy: TimeSlicing\n  timeSlicingConfig: {}\n",
			want: &GpuConfig{TypeMeta: gpuTypeMeta, Sharing: &GpuSharing{
				Strategy: TimeSlicingStrategy, TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(DefaultTimeSlice)}}},
		},
		"null timeSlicingConfig gets interval Default": {
			in: `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":null}}`,
			want: &GpuConfig{TypeMeta: gpuTypeMeta, Sharing: &GpuSharing{
				Strategy: TimeSlicingStrategy, TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(DefaultTimeSlice)}}},
		},
		"missing timeSlicingConfig gets interval Default": {
			in: `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}`,
			want: &GpuConfig{TypeMeta: gpuTypeMeta, Sharing: &GpuSharing{
				Strategy: TimeSlicingStrategy, TimeSlicingConfig: &TimeSlicingConfig{Interval: ptr(DefaultTimeSlice)}}},
		},
		"empty mpsConfig keeps limits unset": {
			in: `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"MigDeviceConfig","sharing":{"strategy":"MPS","mpsConfig":{}}}`,
			want: &MigDeviceConfig{TypeMeta: migTypeMeta, Sharing: &MigDeviceSharing{
				Strategy: MPSStrategy, MPSConfig: &MPSConfig{ClientPriority: ptr(NormalMPSClientPriority)}}},
		},
		"null limits stay unset": {
			in: `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{
				"defaultActiveThreadPercentage":null,"defaultPinnedDeviceMemoryLimit":null,"defaultPerDevicePinnedMemoryLimit":null}}}`,
			want: &GpuConfig{TypeMeta: gpuTypeMeta, Sharing: &GpuSharing{
				Strategy: MPSStrategy, MPSConfig: &MPSConfig{ClientPriority: ptr(NormalMPSClientPriority)}}},
		},
		"YAML alias within the bound": {
			in: "apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\nsharing:\n  strategy: MPS\n  mpsConfig:\n" +
				"    defaultPinnedDeviceMemoryLimit: &limit 8Gi\n    defaultPerDevicePinnedMemoryLimit:\n      \"0\": *limit\n",
			want: &GpuConfig{TypeMeta: gpuTypeMeta, Sharing: &GpuSharing{
				Strategy: MPSStrategy, MPSConfig: &MPSConfig{
					DefaultPinnedDeviceMemoryLimit:    ptr(resource.MustParse("8Gi")),
					DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{"0": resource.MustParse("8Gi")},
					ClientPriority:                    ptr(NormalMPSClientPriority),
				}}},
		},
		"limits at the bounds": {
			in: `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{
				"defaultActiveThreadPercentage":100,"defaultPinnedDeviceMemoryLimit":"1Mi",
				"defaultPerDevicePinnedMemoryLimit":{"GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c":"1Ti","0":1048576}}}}`,
			want: &GpuConfig{TypeMeta: gpuTypeMeta, Sharing: &GpuSharing{
				Strategy: MPSStrategy, MPSConfig: &MPSConfig{
					DefaultActiveThreadPercentage:  ptr(100),
					DefaultPinnedDeviceMemoryLimit: ptr(resource.MustParse("1Mi")),
					DefaultPerDevicePinnedMemoryLimit: map[string]resource.Quantity{
						"GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c": resource.MustParse("1Ti"), "0": resource.MustParse("1Mi"),
					},
					ClientPriority: ptr(NormalMPSClientPriority),
				}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeDefaultValidate([]byte(tc.in))
			if err != nil {
				t.Fatalf("DecodeDefaultValidate: %v", err)
			}
			if diff := cmp.Diff(tc.want, got, cmpQuantities); diff != "" {
				t.Errorf("decoded config (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDecodeDefaultValidateErrors checks that bad configs fail and that the
// error names the offending field (every string in want must appear).
func TestDecodeDefaultValidateErrors(t *testing.T) {
	const gv = `"apiVersion":"gpu.dra.dev/v1beta1"`
	gpu := func(sharing string) string { return `{` + gv + `,"kind":"GpuConfig","sharing":` + sharing + `}` }
	mig := func(sharing string) string { return `{` + gv + `,"kind":"MigDeviceConfig","sharing":` + sharing + `}` }
	mps := func(mpsConfig string) string { return gpu(`{"strategy":"MPS","mpsConfig":` + mpsConfig + `}`) }

	tests := map[string]struct {
		in   string
		want []string
	}{
		// Input shape.
		"empty":           {in: "", want: []string{"config is empty"}},
		"whitespace":      {in: " \n\t", want: []string{"config is empty"}},
		"null":            {in: "null", want: []string{"must be an object, not null"}},
		"array":           {in: `[1]`, want: []string{"must be an object, not an array"}},
		"string":          {in: `"GpuConfig"`, want: []string{"must be an object, not a string"}},
		"number":          {in: `42`, want: []string{"must be an object, not a number"}},
		"truncated JSON":  {in: `{` + gv + `,"kind":"GpuConfig"`, want: []string{"not valid JSON"}},
		"trailing object": {in: `{` + gv + `,"kind":"GpuConfig"} {}`, want: []string{"not valid JSON"}},
		"bad YAML":        {in: "apiVersion: [", want: []string{"YAML"}},
		"two YAML documents": {
			in:   "apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\n---\napiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\n",
			want: []string{"single YAML document"},
		},
		"too large": {
			in:   `{` + gv + `,"kind":"GpuConfig","x":"` + strings.Repeat("a", MaxConfigBytes) + `"}`,
			want: []string{"more than the 10240 bytes"},
		},

		"invalid UTF-8":         {in: `{` + gv + `,"kind":"GpuConfig","sharing":{"strategy":"MPS` + "\xff" + `"}}`, want: []string{"not valid UTF-8", "0xff at offset 81"}},
		"invalid UTF-8 in YAML": {in: "apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\nsh\xc3aring: {}\n", want: []string{"not valid UTF-8", "0xc3 at offset 50"}},

		// Nesting and expansion are bounded before anything recurses.
		"arrays nested too deep": {
			in:   mps(`{"x":` + strings.Repeat("[", 20) + strings.Repeat("]", 20) + `}`),
			want: []string{"sharing.mpsConfig.x[0][0][0][0][0][0][0][0][0][0][0][0][0]: Forbidden", "at most 16 levels deep"},
		},
		"objects nested too deep": {
			in:   mps(`{"x":` + strings.Repeat(`{"a":`, 20) + "1" + strings.Repeat("}", 20) + `}`),
			want: []string{"sharing.mpsConfig.x.a.a.a.a.a.a.a.a.a.a.a.a.a: Forbidden", "at most 16 levels deep"},
		},
		"escaped keys on the path of a deep value": {
			in:   `{` + gv + `,"kind":"GpuConfig","sh\u0061ring":` + strings.Repeat(`{"a\"b":`, 20) + "1" + strings.Repeat("}", 20) + `}`,
			want: []string{`sharing.a"b.a"b`, "at most 16 levels deep"},
		},
		"YAML flow collections nested too deep": {
			in:   "apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\nx: " + strings.Repeat("[", 40) + strings.Repeat("]", 40) + "\n",
			want: []string{"line 3: YAML collections nest more than 32 levels deep"},
		},
		"YAML block sequences nested too deep": {
			in:   "apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\nx:\n" + strings.Repeat("- ", 40) + "1\n",
			want: []string{"line 4: YAML collections nest more than 32 levels deep"},
		},
		"YAML nested too deep within the YAML bound": {
			in:   "apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\nsharing:\n  x: " + strings.Repeat("[", 20) + strings.Repeat("]", 20) + "\n",
			want: []string{"sharing.x[0][0][0][0][0][0][0][0][0][0][0][0][0][0]: Forbidden", "at most 16 levels deep"},
		},
		"YAML aliases expanding past the size limit": {
			in: "apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\na: &a [" + strings.Repeat(`"`+strings.Repeat("x", 100)+`",`, 10) + "x]\n" +
				"b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\n",
			want: []string{"YAML aliases expand the config to more than the 10240 bytes"},
		},

		// apiVersion and kind.
		"missing apiVersion": {in: `{"kind":"GpuConfig"}`, want: []string{"apiVersion: Required value", `"gpu.dra.dev/v1beta1"`}},
		"empty apiVersion":   {in: `{"apiVersion":"","kind":"GpuConfig"}`, want: []string{"apiVersion: Required value"}},
		"wrong apiVersion": {
			in:   `{"apiVersion":"gpu.dra.dev/v1","kind":"GpuConfig"}`,
			want: []string{`apiVersion: Unsupported value: "gpu.dra.dev/v1"`, `supported values: "gpu.dra.dev/v1beta1"`},
		},
		"other group": {
			in:   `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig"}`,
			want: []string{`apiVersion: Unsupported value: "resource.nvidia.com/v1beta1"`},
		},
		"numeric apiVersion": {in: `{"apiVersion":1,"kind":"GpuConfig"}`, want: []string{"apiVersion: Invalid value: 1: must be a string"}},
		"missing kind":       {in: `{` + gv + `}`, want: []string{"kind: Required value", `"GpuConfig", "MigDeviceConfig"`}},
		"unknown kind": {
			in:   `{` + gv + `,"kind":"TpuConfig"}`,
			want: []string{`kind: Unsupported value: "TpuConfig"`, `supported values: "GpuConfig", "MigDeviceConfig"`},
		},
		"meta kind registered by AddToGroupVersion": {in: `{` + gv + `,"kind":"WatchEvent"}`, want: []string{`kind: Unsupported value: "WatchEvent"`}},
		"kind in wrong case":                        {in: `{` + gv + `,"kind":"gpuconfig"}`, want: []string{`kind: Unsupported value: "gpuconfig"`}},
		"Kind key in wrong case":                    {in: `{` + gv + `,"Kind":"GpuConfig"}`, want: []string{"kind: Required value"}},

		// Strictness.
		"unknown top-level field": {in: `{` + gv + `,"kind":"GpuConfig","shareing":{}}`, want: []string{`unknown field "shareing"`}},
		"metadata is unknown":     {in: `{` + gv + `,"kind":"GpuConfig","metadata":{"name":"x"}}`, want: []string{`unknown field "metadata"`}},
		"unknown nested field":    {in: gpu(`{"strategy":"MPS","mpsConfig":{"threads":5}}`), want: []string{`unknown field "sharing.mpsConfig.threads"`}},
		"field in wrong case":     {in: gpu(`{"Strategy":"MPS"}`), want: []string{`unknown field "sharing.Strategy"`}},
		"duplicate JSON field": {
			in:   `{` + gv + `,"kind":"GpuConfig","sharing":{"strategy":"MPS","strategy":"TimeSlicing"}}`,
			want: []string{`duplicate field "sharing.strategy"`},
		},
		"duplicate YAML field": {
			in:   "apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\nsharing:\n  strategy: MPS\n  strategy: Exclusive\n",
			want: []string{`key "strategy" already set`},
		},
		"timeSlicingConfig on a MIG device": {
			in:   mig(`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}`),
			want: []string{`unknown field "sharing.timeSlicingConfig"`},
		},

		// Wrong types.
		"string percentage":  {in: mps(`{"defaultActiveThreadPercentage":"50"}`), want: []string{"sharing.mpsConfig.defaultActiveThreadPercentage", "of type int"}},
		"float percentage":   {in: mps(`{"defaultActiveThreadPercentage":50.5}`), want: []string{"sharing.mpsConfig.defaultActiveThreadPercentage"}},
		"overflowing number": {in: mps(`{"defaultActiveThreadPercentage":1e30}`), want: []string{"sharing.mpsConfig.defaultActiveThreadPercentage"}},
		"huge integer": {
			in:   mps(`{"defaultActiveThreadPercentage":99999999999999999999999}`),
			want: []string{"sharing.mpsConfig.defaultActiveThreadPercentage"},
		},
		"numeric strategy": {in: gpu(`{"strategy":1}`), want: []string{"sharing.strategy"}},
		"string sharing":   {in: gpu(`"MPS"`), want: []string{"sharing", "GpuSharing"}},
		"malformed quantity": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"lots"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "lots"`, "quantity"},
		},
		"malformed per-device quantity": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"0":"1Gi","1":{}}}`),
			want: []string{"sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[1]: Invalid value", "quantity"},
		},
		"list of limits": {in: mps(`{"defaultPerDevicePinnedMemoryLimit":["1Gi"]}`), want: []string{"sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit"}},

		// Validation after defaulting.
		"empty sharing": {in: gpu(`{}`), want: []string{"invalid GpuConfig", "sharing.strategy: Required value", "leave sharing out for Exclusive"}},
		"empty strategy": {
			in:   gpu(`{"strategy":""}`),
			want: []string{"sharing.strategy: Required value", `"Exclusive", "TimeSlicing", "MPS"`},
		},
		"unknown strategy": {
			in:   gpu(`{"strategy":"Shared"}`),
			want: []string{`sharing.strategy: Unsupported value: "Shared"`, `supported values: "Exclusive", "TimeSlicing", "MPS"`},
		},
		"unknown MIG strategy": {in: mig(`{"strategy":"mps"}`), want: []string{`sharing.strategy: Unsupported value: "mps"`}},
		"empty interval": {
			in:   gpu(`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":""}}`),
			want: []string{`sharing.timeSlicingConfig.interval: Unsupported value: ""`, `"Default", "Short", "Medium", "Long"`},
		},
		"unknown interval": {
			in:   gpu(`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"VeryLong"}}`),
			want: []string{`sharing.timeSlicingConfig.interval: Unsupported value: "VeryLong"`},
		},
		"timeSlicingConfig with MPS": {
			in:   gpu(`{"strategy":"MPS","timeSlicingConfig":{}}`),
			want: []string{`sharing.timeSlicingConfig: Forbidden: may only be set when strategy is "TimeSlicing", not "MPS"`},
		},
		"mpsConfig with TimeSlicing": {
			in:   gpu(`{"strategy":"TimeSlicing","mpsConfig":{}}`),
			want: []string{`sharing.mpsConfig: Forbidden: may only be set when strategy is "MPS", not "TimeSlicing"`},
		},
		"sub-configs with Exclusive": {
			in:   gpu(`{"strategy":"Exclusive","timeSlicingConfig":{},"mpsConfig":{}}`),
			want: []string{"sharing.timeSlicingConfig: Forbidden", "sharing.mpsConfig: Forbidden"},
		},
		"mpsConfig with MIG TimeSlicing": {
			in:   mig(`{"strategy":"TimeSlicing","mpsConfig":{"defaultActiveThreadPercentage":50}}`),
			want: []string{`sharing.mpsConfig: Forbidden: may only be set when strategy is "MPS", not "TimeSlicing"`},
		},
		"zero percentage":     {in: mps(`{"defaultActiveThreadPercentage":0}`), want: []string{"sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 0", "from 1 to 100"}},
		"negative percentage": {in: mps(`{"defaultActiveThreadPercentage":-5}`), want: []string{"sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: -5"}},
		"percentage over 100": {in: mps(`{"defaultActiveThreadPercentage":101}`), want: []string{"sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 101"}},
		"huge percentage": {
			in:   mps(`{"defaultActiveThreadPercentage":9223372036854775807}`),
			want: []string{"sharing.mpsConfig.defaultActiveThreadPercentage: Invalid value: 9223372036854775807"},
		},
		"negative limit": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"-1Gi"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "-1Gi": must not be negative`},
		},
		"zero limit": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"0"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "0": must be greater than zero`},
		},
		"limit below a megabyte": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"512Ki"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "512Ki": must be at least 1Mi`},
		},
		"milli-byte limit": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"500m"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "500m": must be at least 1Mi`},
		},
		// MPS takes whole mebibytes: a limit it would have to round is
		// refused, with the two values it could be.
		"limit with a fraction of a mebibyte": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"1.5Mi"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "1536Ki": must be a whole number of mebibytes (a multiple of 1Mi)`, "use 1Mi or 2Mi"},
		},
		"decimal gigabytes": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"8G"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "8G"`, "use 7629Mi or 7630Mi"},
		},
		"per-device limit in kibibytes": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"0":"1025Ki"}}`),
			want: []string{`sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: Invalid value: "1025Ki"`, "use 1Mi or 2Mi"},
		},
		"limit with a fraction of a byte": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"1048576.5"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value`, "whole number of mebibytes", "use 1Mi or 2Mi"},
		},
		"huge limit": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"80Ti"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "80Ti": must be at most 1Ti`},
		},
		"astronomical limit": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"1e100"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "1e100"`, "exponent from e-30 to e30"},
		},
		"large exponent under the bound": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"1e30"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "1e30": must be at most 1Ti`},
		},
		"small exponent under the bound": {
			in: mps(`{"defaultPinnedDeviceMemoryLimit":"1e-30"}`),
			// Quantities keep nine decimal places: 1e-30 reads as 1e-9.
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "1e-9": must be at least 1Mi`},
		},
		// ParseQuantity does not return for minutes on these; Decode must
		// refuse them before parsing.
		"extreme negative exponent": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"1e-999999999"}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "1e-999999999"`},
		},
		"extreme exponent as a JSON number": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":1e-999999999}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "1e-999999999"`},
		},
		"extreme exponent hidden in a duplicate": {
			in: mps(`{"defaultPinnedDeviceMemoryLimit":"1e-999999999","defaultPinnedDeviceMemoryLimit":"1Gi",` +
				`"defaultPerDevicePinnedMemoryLimit":{"0":"2E-999999999","0":"1Gi"}}`),
			want: []string{
				`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "1e-999999999"`,
				`sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[0]: Invalid value: "2E-999999999"`,
			},
		},
		"extreme exponent in YAML": {
			in:   "apiVersion: gpu.dra.dev/v1beta1\nkind: GpuConfig\nsharing:\n  strategy: MPS\n  mpsConfig:\n    defaultPinnedDeviceMemoryLimit: \"1e-999999999\"\n",
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: "1e-999999999"`},
		},
		"extreme positive exponent": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"1":"1e999999999"}}`),
			want: []string{`sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[1]: Invalid value: "1e999999999"`},
		},
		"overlong quantity": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":"0.` + strings.Repeat("0", 70) + `1"}`),
			want: []string{"sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value", "at most 64 characters"},
		},
		"empty limit string": {
			in:   mps(`{"defaultPinnedDeviceMemoryLimit":""}`),
			want: []string{`sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: Invalid value: ""`, "quantity"},
		},
		"empty per-device key": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"":"1Gi"}}`),
			want: []string{`sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[]: Invalid value: ""`, "GPU UUID", "or the device index 0"},
		},
		"index with leading zero": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"01":"1Gi"}}`),
			want: []string{`defaultPerDevicePinnedMemoryLimit[01]: Invalid value: "01"`, "or the device index 0"},
		},
		"negative index": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"-1":"1Gi"}}`),
			want: []string{`defaultPerDevicePinnedMemoryLimit[-1]: Invalid value: "-1"`},
		},
		// A claim's containers see their one MPS device as CUDA ordinal
		// 0; any other index could never be applied.
		"index of a device the containers do not see": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"0":"1Gi","1":"2Gi"}}`),
			want: []string{`defaultPerDevicePinnedMemoryLimit[1]: Invalid value: "1": device index must be 0`, "name other devices by UUID"},
		},
		"index out of range": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"32":"1Gi"}}`),
			want: []string{`defaultPerDevicePinnedMemoryLimit[32]: Invalid value: "32": device index must be 0`},
		},
		"huge index": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"99999999999999999999999":"1Gi"}}`),
			want: []string{`defaultPerDevicePinnedMemoryLimit[99999999999999999999999]`, "device index must be 0"},
		},
		"uppercase UUID": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"GPU-4CF8DB2D-06C0-7D70-1A51-E59B25B2C16C":"1Gi"}}`),
			want: []string{"defaultPerDevicePinnedMemoryLimit[GPU-4CF8DB2D-06C0-7D70-1A51-E59B25B2C16C]", "lowercase"},
		},
		"truncated UUID": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"GPU-4cf8db2d":"1Gi"}}`),
			want: []string{"defaultPerDevicePinnedMemoryLimit[GPU-4cf8db2d]"},
		},
		"MIG UUID in a GpuConfig": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"MIG-9a7c1c4e-7d2b-5f37-a1b0-0c5a3e2f6d11":"1Gi"}}`),
			want: []string{"defaultPerDevicePinnedMemoryLimit[MIG-9a7c1c4e-7d2b-5f37-a1b0-0c5a3e2f6d11]", "a GPU UUID (GPU-"},
		},
		"GPU UUID in a MigDeviceConfig": {
			in:   mig(`{"strategy":"MPS","mpsConfig":{"defaultPerDevicePinnedMemoryLimit":{"GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c":"1Gi"}}}`),
			want: []string{"invalid MigDeviceConfig", "defaultPerDevicePinnedMemoryLimit[GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c]", "a MIG device UUID (MIG-"},
		},
		"zero per-device limit": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"0":"0"}}`),
			want: []string{`defaultPerDevicePinnedMemoryLimit[0]: Invalid value: "0": must be greater than zero`},
		},
		"null per-device limit": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"0":null}}`),
			want: []string{`defaultPerDevicePinnedMemoryLimit[0]: Invalid value: "0": must be greater than zero`},
		},
		"negative per-device limit": {
			in:   mps(`{"defaultPerDevicePinnedMemoryLimit":{"1":"-2Gi"}}`),
			want: []string{`defaultPerDevicePinnedMemoryLimit[1]: Invalid value: "-2Gi": must not be negative`},
		},
		"empty client priority": {
			in:   mps(`{"clientPriority":""}`),
			want: []string{`sharing.mpsConfig.clientPriority: Unsupported value: ""`, `"Normal", "BelowNormal"`},
		},
		"numeric client priority": {in: mps(`{"clientPriority":1}`), want: []string{"sharing.mpsConfig.clientPriority"}},
		"every error at once": {
			in: mps(`{"defaultActiveThreadPercentage":0,"defaultPinnedDeviceMemoryLimit":"-1",` +
				`"defaultPerDevicePinnedMemoryLimit":{"x":"1Gi"},"clientPriority":"High"}`),
			want: []string{
				"sharing.mpsConfig.defaultActiveThreadPercentage",
				"sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
				"sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[x]",
				"sharing.mpsConfig.clientPriority",
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := DecodeDefaultValidate([]byte(tc.in))
			if err == nil {
				t.Fatalf("DecodeDefaultValidate succeeded with %#v, want an error", got)
			}
			if got != nil {
				t.Errorf("DecodeDefaultValidate returned %#v with its error, want nil", got)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// TestDecodeDefaultValidateErrorIsAggregate checks that a caller (the
// webhook) can get at the individual field errors.
func TestDecodeDefaultValidateErrorIsAggregate(t *testing.T) {
	in := `{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS",` +
		`"mpsConfig":{"defaultActiveThreadPercentage":0,"clientPriority":"High"}}}`
	_, err := DecodeDefaultValidate([]byte(in))
	var agg utilerrors.Aggregate
	if !errors.As(err, &agg) {
		t.Fatalf("error %v does not wrap an Aggregate", err)
	}
	var fields []string
	for _, e := range agg.Errors() {
		var fe *field.Error
		if !errors.As(e, &fe) {
			t.Fatalf("aggregated error %v is not a *field.Error", e)
		}
		fields = append(fields, fe.Field)
	}
	want := []string{"sharing.mpsConfig.defaultActiveThreadPercentage", "sharing.mpsConfig.clientPriority"}
	if diff := cmp.Diff(want, fields); diff != "" {
		t.Errorf("field errors (-want +got):\n%s", diff)
	}
}

// TestDecodeDoesNotDefault checks that Decode alone leaves the object as
// written, so callers that want the raw config (to show it) can have it.
func TestDecodeDoesNotDefault(t *testing.T) {
	got, err := Decode([]byte(`{"apiVersion":"gpu.dra.dev/v1beta1","kind":"GpuConfig"}`))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&GpuConfig{TypeMeta: gpuTypeMeta}, got); diff != "" {
		t.Errorf("Decode (-want +got):\n%s", diff)
	}
}

// TestEncodeDecodeRoundTrip checks that every example survives JSON
// encoding and decoding unchanged after defaulting.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		t.Run(e.Name(), func(t *testing.T) {
			first, err := DecodeDefaultValidate(readTestdata(t, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			encoded, err := json.Marshal(first)
			if err != nil {
				t.Fatal(err)
			}
			second, err := DecodeDefaultValidate(encoded)
			if err != nil {
				t.Fatalf("decode %s: %v", encoded, err)
			}
			if diff := cmp.Diff(first, second, cmpQuantities); diff != "" {
				t.Errorf("round trip (-first +second):\n%s", diff)
			}
		})
	}
}
