// Package scenarios runs the demo scenarios of demo/specs on a real cluster: it
// applies a scenario's objects, waits until every pod is where the scenario says it
// should be, and reports what each pod got — node, claims, allocated devices — and
// what its containers actually see (GPU environment, device nodes, nvidia-smi -L,
// MPS pipe directory). The demo (demo/) prints the reports; the e2e tests
// (test/e2e) assert on them.
package scenarios

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Pod annotations the runner understands.
const (
	// AnnotationExpect is the phase a pod must settle in: "Running" (default) or
	// "Pending" (refused or not schedulable, by design of the scenario).
	AnnotationExpect = "demo.gpu.dra.dev/expect"
	// AnnotationExpectEvent is text that an event of a Pending pod must contain.
	AnnotationExpectEvent = "demo.gpu.dra.dev/expect-event"
	// AnnotationExpectNodeLabel is a label (key=value) the node of a running
	// pod must have, e.g. the GPU product a CEL selector asked for.
	AnnotationExpectNodeLabel = "demo.gpu.dra.dev/expect-node-label"
	// AnnotationFleet, on a scenario's Namespace, is the number of nodes the
	// scenario needs. Other scenarios run on one node with the others
	// cordoned (see Runner.SetUnschedulable).
	AnnotationFleet = "demo.gpu.dra.dev/fleet"
)

// Scenario is one file of demo/specs: a YAML stream applied in order.
type Scenario struct {
	// Name is the file name without extension, e.g. "01-first-gpu".
	Name string
	// Title is the first line of the leading comment; Description the rest.
	Title       string
	Description string
	Path        string
	Objects     []*unstructured.Unstructured
}

// Namespaces lists the namespaces the scenario creates.
func (s *Scenario) Namespaces() []string {
	var out []string
	for _, o := range s.Objects {
		if o.GetKind() == "Namespace" && o.GetAPIVersion() == "v1" {
			out = append(out, o.GetName())
		}
	}
	return out
}

// FleetNodes is the number of nodes the scenario needs when it runs across
// nodes (AnnotationFleet), else 0.
func (s *Scenario) FleetNodes() int {
	for _, o := range s.Objects {
		if o.GetKind() == "Namespace" && o.GetAPIVersion() == "v1" {
			if n, err := strconv.Atoi(o.GetAnnotations()[AnnotationFleet]); err == nil && n > 0 {
				return n
			}
		}
	}
	return 0
}

// Load reads every *.yaml file of dir, in name order.
func Load(dir string) ([]*Scenario, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no scenarios (*.yaml) in %s", dir)
	}
	sort.Strings(paths)
	var out []*Scenario
	for _, p := range paths {
		s, err := LoadFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// LoadFile reads one scenario file.
func LoadFile(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s := &Scenario{Name: strings.TrimSuffix(filepath.Base(path), filepath.Ext(path)), Path: path}
	s.Title, s.Description = leadingComment(data)
	if s.Objects, err = DecodeObjects(data); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(s.Namespaces()) == 0 {
		return nil, fmt.Errorf("%s: a scenario must create its own Namespace", path)
	}
	return s, nil
}

// DecodeObjects decodes a multi-document YAML file into objects, each with a
// kind and a name; documents of only comments are skipped.
func DecodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		obj := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(doc, &obj.Object); err != nil {
			return nil, err
		}
		if len(obj.Object) == 0 {
			continue // only comments
		}
		if obj.GetKind() == "" || obj.GetName() == "" {
			return nil, fmt.Errorf("object without kind or name: %v", obj.Object)
		}
		objs = append(objs, obj)
	}
}

// leadingComment returns the first sentence of the file's leading comment block
// (without "Scenario N:") and the rest of the block.
func leadingComment(data []byte) (title, rest string) {
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(l, "#") {
			break
		}
		lines = append(lines, strings.TrimPrefix(strings.TrimPrefix(l, "#"), " "))
	}
	text := strings.Join(lines, "\n")
	if strings.HasPrefix(text, "Scenario") {
		if _, after, ok := strings.Cut(text, ": "); ok {
			text = after
		}
	}
	end := strings.Index(text, ". ")
	if i := strings.Index(text, ".\n"); i >= 0 && (end < 0 || i < end) {
		end = i
	}
	if end < 0 {
		return strings.ReplaceAll(text, "\n", " "), ""
	}
	return strings.ReplaceAll(text[:end], "\n", " "), strings.TrimSpace(text[end+1:])
}
