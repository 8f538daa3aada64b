package v1beta1

import "testing"

// TestYAMLNesting checks the YAML pre-scan's depth estimate: never below
// the real nesting, and not fooled by brackets in quotes, comments and
// block scalars.
func TestYAMLNesting(t *testing.T) {
	tests := map[string]struct {
		in      string
		depth   int
		aliases bool
	}{
		"flat mapping":               {in: "a: 1\nb: 2\n", depth: 1},
		"nested mappings":            {in: "a:\n  b:\n    c: 1\nd: 2\n", depth: 3},
		"sequence under a key":       {in: "a:\n- 1\n- 2\n", depth: 2},
		"compact nested sequences":   {in: "a:\n- - - 1\n", depth: 4},
		"flow in block":              {in: "a: {b: [1, [2]]}\n", depth: 4},
		"flow over lines":            {in: "a: [\n  [1,\n [2]]]\n", depth: 4},
		"JSON document":              {in: `{"a": {"b": [1]}}`, depth: 4},
		"brackets in quotes":         {in: "a: \"[[[\\\"[[\"\nb: '[[''[['\n", depth: 1},
		"brackets in a comment":      {in: "a: 1 # [[[[\n# {{{{\n", depth: 1},
		"brackets in a plain scalar": {in: "a: b[[[c\n", depth: 1},
		"brackets in a block scalar": {in: "a: |\n  [[[[\n  {{{{\nb: 1\n", depth: 1},
		"multi-line quoted scalar":   {in: "a: \"x\n  [[[[\"\nb: [1]\n", depth: 2},
		"anchor before a flow node":  {in: "a: &x [[1]]\n", depth: 3},
		"alias":                      {in: "a: &x 1\nb: *x\n", depth: 1, aliases: true},
		"star in a quoted scalar":    {in: "a: '*x'\n", depth: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			depth, _, aliases := yamlNesting([]byte(tc.in), maxYAMLDepthBound)
			if depth != tc.depth || aliases != tc.aliases {
				t.Errorf("yamlNesting(%q) = depth %d, aliases %v; want %d, %v", tc.in, depth, aliases, tc.depth, tc.aliases)
			}
		})
	}
}
