package deviceclass

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/internal/golden"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// The chart's template is generated from Classes; this keeps them in sync.
func TestChartTemplate(t *testing.T) {
	golden.Check(t, "../../"+ChartTemplatePath, HelmTemplate())
}

// Rendering the template the way Helm does gives exactly DeviceClasses(name)
// with the extended resource names the values give each class, plus one
// ProfileClass per listed MIG profile.
func TestChartTemplateRendersClasses(t *testing.T) {
	for name, tc := range map[string]struct {
		driver, extended string
		ext              map[string]any
		profiles         []string
	}{
		"default driver with extended resource": {driver: "gpu.dra.dev", extended: "nvidia.com/gpu"},
		"other driver, no extended resource":    {driver: "gpu.example.com"},
		"NVIDIA's driver name":                  {driver: "gpu.nvidia.com", extended: "nvidia.com/gpu", profiles: []string{"1g.10gb"}},
		"device plugin names": {driver: "gpu.dra.dev", extended: "nvidia.com/gpu",
			ext: map[string]any{"timeslice": "nvidia.com/gpu.shared"}, profiles: []string{"1g.10gb", "1g.10gb+me"}},
		"nvidia.com/gpu means a time-slicing share": {driver: "gpu.dra.dev",
			ext: map[string]any{"timeslice": "nvidia.com/gpu", "mps": "example.com/mps"}},
	} {
		t.Run(name, func(t *testing.T) {
			ext := map[string]any{}
			for k, v := range tc.ext {
				ext[k] = v
			}
			var profiles []any
			for _, p := range tc.profiles {
				profiles = append(profiles, p)
			}
			ext["migProfiles"] = profiles
			got, err := renderChartTemplate(t, map[string]any{
				"driverName":           tc.driver,
				"extendedResourceName": tc.extended,
				"extendedResources":    ext,
				"deviceClasses":        map[string]any{"create": true},
			})
			if err != nil {
				t.Fatal(err)
			}
			want := DeviceClasses(tc.driver)
			for i, c := range Classes {
				v, _ := tc.ext[string(c.DeviceType)].(string)
				if c.DeviceType == vocabulary.KindGPU {
					v = tc.extended
				}
				if v != "" {
					want[i].Spec.ExtendedResourceName = ptr.To(v)
				}
			}
			for _, p := range tc.profiles {
				want = append(want, ProfileClass{Profile: p}.DeviceClass(tc.driver))
			}
			if len(got) != len(want) {
				t.Fatalf("rendered %d DeviceClasses, want %d", len(got), len(want))
			}
			for i := range want {
				got[i].Labels = nil // from the chart's helper
				if diff := cmp.Diff(want[i], got[i]); diff != "" {
					t.Errorf("DeviceClass %d (-want +got):\n%s", i, diff)
				}
			}
		})
	}
	if got, err := renderChartTemplate(t, map[string]any{
		"driverName": "gpu.dra.dev", "deviceClasses": map[string]any{"create": false},
	}); err != nil || len(got) != 0 {
		t.Errorf("deviceClasses.create=false rendered %d DeviceClasses (err %v)", len(got), err)
	}
}

// Two classes serving one extended resource name fail the install: the
// scheduler would silently use the newer one.
func TestChartTemplateRefusesNameServedTwice(t *testing.T) {
	for name, ext := range map[string]map[string]any{
		"gpu and timeslice":    {"timeslice": "nvidia.com/gpu"},
		"profile listed twice": {"migProfiles": []any{"1g.10gb", "1g.10gb"}},
		"mig and a profile":    {"mig": "nvidia.com/mig-1g.10gb", "migProfiles": []any{"1g.10gb"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := renderChartTemplate(t, map[string]any{
				"driverName": "gpu.dra.dev", "extendedResourceName": "nvidia.com/gpu",
				"extendedResources": ext, "deviceClasses": map[string]any{"create": true},
			})
			if err == nil || !strings.Contains(err.Error(), "must name each extended resource once") {
				t.Fatalf("rendered, want the duplicate refused; err %v", err)
			}
		})
	}
}

// renderChartTemplate executes the template with stand-ins for the Helm
// functions it uses and decodes the resulting YAML stream.
func renderChartTemplate(t *testing.T, values map[string]any) ([]*resourceapi.DeviceClass, error) {
	t.Helper()
	funcs := template.FuncMap{
		"include": func(name string, _ any) string {
			if name == "gpu-dra-driver.driverName" {
				return values["driverName"].(string) // the chart's helper; test/chart runs the real one
			}
			return "app.kubernetes.io/name: gpu-dra-driver"
		},
		"nindent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return "\n" + pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
		"quote":    func(s string) string { return strconv.Quote(s) },
		"required": func(_ string, v string) string { return v },
		"default": func(d any, v ...any) any {
			if len(v) == 0 || v[0] == nil {
				return d
			}
			return v[0]
		},
		"dict":    func() map[string]any { return map[string]any{} },
		"list":    func(xs ...any) []any { return xs },
		"append":  func(l []any, x any) []any { return append(l, x) },
		"replace": func(old, new, s string) string { return strings.ReplaceAll(s, old, new) },
		"uniq": func(l []any) []any {
			var out []any
			for _, x := range l {
				if !slices.Contains(out, x) {
					out = append(out, x)
				}
			}
			return out
		},
		"join": func(sep string, l []any) string {
			var ss []string
			for _, x := range l {
				ss = append(ss, fmt.Sprint(x))
			}
			return strings.Join(ss, sep)
		},
		"fail": func(msg string) (string, error) { return "", errors.New(msg) },
	}
	tmpl, err := template.New("deviceclasses").Funcs(funcs).Parse(string(HelmTemplate()))
	if err != nil {
		t.Fatalf("parse template: %v", err)
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, map[string]any{"Values": values}); err != nil {
		return nil, err
	}
	var classes []*resourceapi.DeviceClass
	for _, doc := range strings.Split(out.String(), "\n---\n") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		var c resourceapi.DeviceClass
		if err := yaml.UnmarshalStrict([]byte(strings.TrimPrefix(doc, "---\n")), &c); err != nil {
			t.Fatalf("decode rendered DeviceClass: %v\n%s", err, doc)
		}
		classes = append(classes, &c)
	}
	return classes, nil
}
