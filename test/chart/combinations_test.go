package chart

import (
	"testing"
)

// Every documented values combination (ci/*-values.yaml, listed in the
// chart's README) passes `helm lint --strict` (the schema included) and
// renders with `helm template`; defaults-values.yaml is values.yaml itself.
func TestValuesCombinations(t *testing.T) {
	helmBinary(t) // skip (or fail in CI) once, not per file
	for _, c := range combinations(t) {
		t.Run(c.name, func(t *testing.T) {
			if _, err := helm(t, "lint", "--strict", chartDir, "-f", c.path); err != nil {
				t.Error(err)
			}
			if _, err := helm(t, "template", "rel", chartDir, "-n", "ns", "-f", c.path); err != nil {
				t.Error(err)
			}
		})
	}
}
