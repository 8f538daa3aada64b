package v1beta1

import (
	"bytes"
	"fmt"

	yamlv3 "go.yaml.in/yaml/v3"
)

// maxYAMLDepthBound is the bound on yamlNesting's estimate. The estimate
// may count a level more than there is (a flow collection on its own line
// counts both the line's indentation and its bracket), so it gets twice
// MaxConfigDepth; the exact limit, with the field path, is checked on the
// JSON the YAML converts to.
const maxYAMLDepthBound = 2 * MaxConfigDepth

// checkYAMLBounds bounds what parsing and converting a YAML config can
// cost before any YAML parser sees it: the YAML parsers build a node per
// level of nesting and expand every alias, so a 10 KiB document could
// otherwise take hundreds of milliseconds and megabytes (nested "- - - …"
// or "[[[…", or aliases of aliases: a "billion laughs").
func checkYAMLBounds(data []byte) error {
	depth, line, aliases := yamlNesting(data, maxYAMLDepthBound)
	if depth > maxYAMLDepthBound {
		return fmt.Errorf("line %d: YAML collections nest more than %d levels deep (this API's types nest 4)", line, maxYAMLDepthBound)
	}
	if aliases {
		return checkAliasExpansion(data)
	}
	return nil
}

// yamlNesting scans YAML text once and returns an upper bound of how deeply
// its collections nest (block indentation levels, "- " and "? " entries and
// flow brackets outside quotes and comments), the line where that depth is
// first reached, and whether the text may use an alias. Block scalars and
// quoted scalars are skipped, so brackets in them do not count. It stops
// once the depth exceeds limit.
func yamlNesting(data []byte, limit int) (maxDepth, maxLine int, aliases bool) {
	var (
		indents     []int // columns of the open block collections
		flow        int   // open flow collections
		quote       byte  // the open quote, 0 outside quoted scalars
		escaped     bool
		blockScalar = -1 // parent indentation of an open block scalar
	)
	note := func(line int) {
		if d := len(indents) + flow; d > maxDepth {
			maxDepth, maxLine = d, line
		}
	}
	lineNo := 0
	for line := range bytes.Lines(data) {
		if maxDepth > limit {
			break
		}
		lineNo++
		line = bytes.TrimSuffix(line, []byte("\n"))
		col := 0
		for col < len(line) && (line[col] == ' ' || line[col] == '\t') {
			col++
		}
		blank := col == len(line) || line[col] == '\r' || line[col] == '#'
		if quote == 0 && blockScalar >= 0 {
			if blank || col > blockScalar {
				continue // a line of the block scalar
			}
			blockScalar = -1
		}
		if quote == 0 && flow == 0 {
			if blank {
				continue
			}
			for len(indents) > 0 && indents[len(indents)-1] > col {
				indents = indents[:len(indents)-1]
			}
			if len(indents) == 0 || indents[len(indents)-1] < col {
				indents = append(indents, col)
				note(lineNo)
			}
		}
		start := col
		if quote != 0 {
			start = 0
		}
		nodeStart := true
	scan:
		for i := start; i < len(line) && maxDepth <= limit; i++ {
			c := line[i]
			spaceAfter := i+1 == len(line) || line[i+1] == ' ' || line[i+1] == '\t' || line[i+1] == '\r'
			switch {
			case quote == '"':
				switch {
				case escaped:
					escaped = false
				case c == '\\':
					escaped = true
				case c == '"':
					quote, nodeStart = 0, false
				}
			case quote == '\'':
				if c == '\'' {
					if i+1 < len(line) && line[i+1] == '\'' {
						i++ // an escaped quote
					} else {
						quote, nodeStart = 0, false
					}
				}
			case c == ' ' || c == '\t' || c == '\r':
			case c == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
				break scan // a comment
			case nodeStart && flow == 0 && (c == '-' || c == '?') && spaceAfter:
				// A block sequence entry or explicit key opens a level.
				indents = append(indents, i+1)
				note(lineNo)
			case c == ':' && (spaceAfter || flow > 0):
				nodeStart = true
			case nodeStart && (c == '&' || c == '!'):
				for i+1 < len(line) && line[i+1] != ' ' && line[i+1] != '\t' {
					i++ // an anchor or tag; the node follows
				}
			case c == '*':
				// An alias; a '*' inside a plain scalar only costs a
				// closer look.
				aliases, nodeStart = true, false
			case nodeStart && (c == '\'' || c == '"'):
				quote = c
			case nodeStart && flow == 0 && (c == '|' || c == '>'):
				blockScalar = col
				break scan
			case c == '[' || c == '{':
				if nodeStart || flow > 0 {
					flow++
					note(lineNo)
					nodeStart = true
				}
			case c == ']' || c == '}':
				if flow > 0 {
					flow--
				}
				nodeStart = false
			case c == ',' && flow > 0:
				nodeStart = true
			default:
				nodeStart = false
			}
		}
	}
	return maxDepth, maxLine, aliases
}

// checkAliasExpansion parses a YAML document that uses aliases into nodes,
// without expanding them, and rejects it when expanding them (as the
// conversion to JSON does) would make it larger than a config may be.
func checkAliasExpansion(data []byte) error {
	var doc yamlv3.Node
	if err := yamlv3.Unmarshal(data, &doc); err != nil {
		return err
	}
	sizes := map[*yamlv3.Node]int{}
	var size func(n *yamlv3.Node) int
	size = func(n *yamlv3.Node) int {
		if s, ok := sizes[n]; ok {
			return s
		}
		sizes[n] = MaxConfigBytes + 1 // a cycle: yaml.v3 rejects those; count it as too large
		s := len(n.Value) + 3         // quotes and a separator
		if n.Kind == yamlv3.AliasNode && n.Alias != nil {
			s = size(n.Alias)
		}
		for _, c := range n.Content {
			if s += size(c); s > MaxConfigBytes {
				break
			}
		}
		sizes[n] = s
		return s
	}
	if s := size(&doc); s > MaxConfigBytes {
		return fmt.Errorf("YAML aliases expand the config to more than the %d bytes a config may have", MaxConfigBytes)
	}
	return nil
}
