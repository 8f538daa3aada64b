package chart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpu-dra/gpu-dra-driver/internal/golden"
)

// The chart's README.md is generated from Chart.yaml, values.yaml (every
// value with its type, default and comment), values.schema.json (the types)
// and ci/*-values.yaml (the tested combinations). -update rewrites it.
func TestChartREADME(t *testing.T) {
	golden.Check(t, filepath.Join(chartDir, "README.md"), renderREADME(t))
}

// renderREADME is the chart's README.md.
func renderREADME(t *testing.T) []byte {
	t.Helper()
	var chart struct {
		Name        string `json:"name"`
		Description string `json:"description"`
	}
	data, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &chart); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<!-- Generated from values.yaml, values.schema.json and ci/*-values.yaml by `+"`go test ./test/chart -update`"+`. Do not edit. -->
# %s Helm chart

%s

    helm install %[1]s deployments/helm/%[1]s -n %[1]s --create-namespace

What it deploys: [docs/demo.md](../../../docs/demo.md#the-helm-chart-deploymentshelmgpu-dra-driver);
the security controls and the values that weaken them: [docs/security.md](../../../docs/security.md).

[values.schema.json](values.schema.json) types every value: `+"`helm install`, `helm upgrade` and `helm template`"+`
refuse an unknown key or a value of the wrong type, naming its path, e.g.
`+"`at '/kubeletPlugin': additional properties 'metricAuth' not allowed`"+`. Kubernetes types
(nodeSelector, affinity, tolerations, resources, annotations, updateStrategy) are passed through
and checked by the API server.

## Values

| Value | Type | Default | Description |
|---|---|---|---|
`, chart.Name, strings.TrimSpace(chart.Description))
	schema := loadSchema(t)
	for _, v := range values(t, schema) {
		def := "" // a section's values have rows of their own
		if m, ok := v.def.(map[string]any); v.leaf || (ok && len(m) == 0) {
			def = code(defaultText(t, v.def))
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", v.path, typeText(schema, v.schema), def, cell(v.description))
	}
	b.WriteString(`
## Tested values combinations

Each file below is a combination of values the docs tell users to set. ` + "`make check`" + ` runs
` + "`helm lint --strict`" + ` and ` + "`helm template`" + ` with each (test/chart), and the e2e suite
(` + "`make e2e`" + `) dry-runs each rendering on a real API server. Install one with ` + "`-f <file>`" + `.

| File | What it sets |
|---|---|
`)
	for _, c := range combinations(t) {
		fmt.Fprintf(&b, "| [`ci/%s`](ci/%[1]s) | %s |\n", c.name, cell(c.description))
	}
	return b.Bytes()
}

// defaultText is a default as YAML flow-ish text: scalars bare, "" quoted,
// objects and lists as compact JSON.
func defaultText(t *testing.T, v any) string {
	t.Helper()
	switch v := v.(type) {
	case string:
		if v == "" {
			return `""`
		}
		return v
	case nil:
		return "null"
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// typeText is a schema node's type in words.
func typeText(root, n schemaNode) string {
	n, err := resolve(root, n)
	if err != nil {
		return "?"
	}
	if enum, ok := n["enum"].([]any); ok {
		var alts []string
		for _, e := range enum {
			out, _ := json.Marshal(e)
			alts = append(alts, code(strings.Trim(string(out), `"`)))
			if e == "" {
				alts[len(alts)-1] = code(`""`)
			}
		}
		return "one of " + strings.Join(alts, ", ")
	}
	var types []string
	switch ty := n["type"].(type) {
	case string:
		types = []string{ty}
	case []any:
		for _, x := range ty {
			types = append(types, fmt.Sprint(x))
		}
	}
	for i, ty := range types {
		switch ty {
		case "array":
			if items, ok := n["items"].(map[string]any); ok {
				types[i] = "list of " + typeText(root, items)
			} else {
				types[i] = "list"
			}
		case "object":
			if ap, ok := n["additionalProperties"].(map[string]any); ok && !ownObject(n) {
				types[i] = "map of " + typeText(root, ap)
			}
		}
	}
	return strings.Join(types, " or ")
}

// code is s as a Markdown code span.
func code(s string) string {
	if strings.Contains(s, "`") {
		return "``" + s + "``"
	}
	return "`" + s + "`"
}

// cell is s escaped for a Markdown table cell: pipes, and outside code
// spans the angle brackets of placeholders such as <driverName>, which would
// otherwise be taken for HTML tags.
func cell(s string) string {
	parts := strings.Split(s, "`")
	for i := 0; i < len(parts); i += 2 {
		parts[i] = strings.NewReplacer("<", "&lt;", ">", "&gt;").Replace(parts[i])
	}
	return strings.ReplaceAll(strings.Join(parts, "`"), "|", `\|`)
}

// combination is one documented values file under ci/.
type combination struct {
	name, path, description string
}

// combinations are the chart's ci/*-values.yaml files, described by their
// leading comment.
func combinations(t *testing.T) []combination {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatalf("no values combinations in %s/ci", chartDir)
	}
	sort.Strings(paths)
	var out []combination
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var lead []string
		for _, line := range strings.Split(string(data), "\n") {
			if !strings.HasPrefix(line, "#") {
				break
			}
			lead = append(lead, line)
		}
		c := combination{name: filepath.Base(p), path: p, description: description(strings.Join(lead, "\n"))}
		if c.description == "" {
			t.Errorf("%s: no leading comment saying what it is for", p)
		}
		out = append(out, c)
	}
	return out
}
