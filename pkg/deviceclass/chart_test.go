package deviceclass

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"text/template"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/internal/golden"
)

// The chart's template is generated from Classes; this keeps them in sync.
func TestChartTemplate(t *testing.T) {
	golden.Check(t, "../../"+ChartTemplatePath, HelmTemplate())
}

// Rendering the template the way Helm does gives exactly DeviceClasses(name),
// plus the extended resource name on the whole-GPU class.
func TestChartTemplateRendersClasses(t *testing.T) {
	for name, tc := range map[string]struct {
		driver, extended string
	}{
		"default driver with extended resource": {driver: "gpu.dra.dev", extended: "nvidia.com/gpu"},
		"other driver, no extended resource":    {driver: "gpu.example.com"},
	} {
		t.Run(name, func(t *testing.T) {
			got := renderChartTemplate(t, map[string]any{
				"driverName":           tc.driver,
				"extendedResourceName": tc.extended,
				"deviceClasses":        map[string]any{"create": true},
			})
			want := DeviceClasses(tc.driver)
			if tc.extended != "" {
				want[0].Spec.ExtendedResourceName = ptr.To(tc.extended)
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
	if got := renderChartTemplate(t, map[string]any{
		"driverName": "gpu.dra.dev", "deviceClasses": map[string]any{"create": false},
	}); len(got) != 0 {
		t.Errorf("deviceClasses.create=false rendered %d DeviceClasses", len(got))
	}
}

// renderChartTemplate executes the template with stand-ins for the Helm
// functions it uses and decodes the resulting YAML stream.
func renderChartTemplate(t *testing.T, values map[string]any) []*resourceapi.DeviceClass {
	t.Helper()
	funcs := template.FuncMap{
		"include": func(string, any) string { return "app.kubernetes.io/name: gpu-dra-driver" },
		"nindent": func(n int, s string) string {
			pad := strings.Repeat(" ", n)
			return "\n" + pad + strings.ReplaceAll(s, "\n", "\n"+pad)
		},
		"quote":    func(s string) string { return strconv.Quote(s) },
		"required": func(_ string, v string) string { return v },
	}
	tmpl, err := template.New("deviceclasses").Funcs(funcs).Parse(string(HelmTemplate()))
	if err != nil {
		t.Fatalf("parse template: %v", err)
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, map[string]any{"Values": values}); err != nil {
		t.Fatalf("execute template: %v", err)
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
	return classes
}
