package chart

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// schemaNode is one node of values.schema.json.
type schemaNode = map[string]any

// loadSchema reads values.schema.json.
func loadSchema(t *testing.T) schemaNode {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s schemaNode
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	return s
}

// resolve follows a local "$ref" (#/definitions/<name>) from root.
func resolve(root, n schemaNode) (schemaNode, error) {
	ref, ok := n["$ref"].(string)
	if !ok {
		return n, nil
	}
	name, ok := strings.CutPrefix(ref, "#/definitions/")
	if !ok {
		return nil, fmt.Errorf("$ref %q: only #/definitions/<name> is supported", ref)
	}
	defs, _ := root["definitions"].(map[string]any)
	d, ok := defs[name].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("$ref %q: no such definition", ref)
	}
	return d, nil
}

// ownObject says whether n is one of the chart's own objects (named
// properties, unknown keys refused), as opposed to a leaf value such as a
// free-form map of a Kubernetes type.
func ownObject(n schemaNode) bool {
	_, ok := n["properties"].(map[string]any)
	return ok
}

// value is one key of values.yaml with its schema.
type value struct {
	path        string // dotted, e.g. kubeletPlugin.metricsAuth
	leaf        bool   // not one of the chart's own objects
	schema      schemaNode
	def         any // the default, decoded
	description string
}

// values walks values.yaml in file order, pairing every key with its schema
// entry; a key without one is an error naming its path.
func values(t *testing.T, schema schemaNode) []value {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	var out []value
	var walk func(prefix string, m *yaml.Node, s schemaNode) error
	walk = func(prefix string, m *yaml.Node, s schemaNode) error {
		if m.Kind != yaml.MappingNode {
			return fmt.Errorf("values.yaml: %s is an object in values.schema.json but not in values.yaml", strings.TrimSuffix(prefix, "."))
		}
		props, _ := s["properties"].(map[string]any)
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			path := prefix + k.Value
			ps, ok := props[k.Value].(map[string]any)
			if !ok {
				return fmt.Errorf("values.yaml: %s has no entry in values.schema.json", path)
			}
			ps, err := resolve(schema, ps)
			if err != nil {
				return fmt.Errorf("values.schema.json: %s: %w", path, err)
			}
			val := value{path: path, leaf: !ownObject(ps), schema: ps, description: description(k.HeadComment)}
			if err := v.Decode(&val.def); err != nil {
				return fmt.Errorf("values.yaml: %s: %w", path, err)
			}
			out = append(out, val)
			if !val.leaf {
				if err := walk(path+".", v, ps); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if len(doc.Content) != 1 {
		t.Fatal("values.yaml: not one YAML document")
	}
	if err := walk("", doc.Content[0], schema); err != nil {
		t.Fatal(err)
	}
	return out
}

// commentMarker is the "#" and the space after it that start a comment line.
var commentMarker = regexp.MustCompile(`(?m)^#[ \t]?`)

// description is a key's head comment as one line: its last paragraph (the
// one that touches the key; a paragraph above it introduces a section).
func description(comment string) string {
	paras := strings.Split(strings.TrimSpace(comment), "\n\n")
	text := commentMarker.ReplaceAllString(paras[len(paras)-1], "")
	return strings.Join(strings.Fields(text), " ")
}

// Every key in values.yaml has a schema entry (values walks them all), every
// value and section is described by the comment above it, and every object
// of the chart's own refuses unknown keys, so that a mistyped key is an error
// naming its path rather than a silently ignored value.
func TestSchemaCoversEveryValue(t *testing.T) {
	schema := loadSchema(t)
	vals := values(t, schema)
	if len(vals) < 50 {
		t.Fatalf("values.yaml has %d keys; the walk lost some", len(vals))
	}
	for _, v := range vals {
		if v.description == "" {
			t.Errorf("values.yaml: %s has no comment describing it", v.path)
		}
	}
	var check func(path string, n schemaNode)
	check = func(path string, n schemaNode) {
		if ownObject(n) && n["additionalProperties"] != false {
			t.Errorf("values.schema.json: %s: an object with named properties must set additionalProperties: false", path)
		}
		for _, key := range []string{"properties", "definitions"} {
			children, _ := n[key].(map[string]any)
			for name, c := range children {
				if c, ok := c.(map[string]any); ok {
					check(path+"/"+key+"/"+name, c)
				}
			}
		}
		if items, ok := n["items"].(map[string]any); ok {
			check(path+"/items", items)
		}
	}
	check("#", schema)
}
