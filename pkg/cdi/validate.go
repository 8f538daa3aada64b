package cdi

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sync"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
)

// specValidator checks claim specs with the CDI library's own reader
// (cdiapi.ReadSpec: strict YAML parsing, then validation), as runtimes read
// them. Its cost is the parsing, in proportion to the bytes, and most bytes
// of every spec are the same: the driver files' mounts, which only change
// with the writer. So a spec whose mounts equal those of a spec validated
// whole before is checked without them. That is the same check: the
// library validates container edits one by one (each mount alone, no rule
// across them), and the mounts are encoded the same way in both specs.
type specValidator struct {
	mu sync.Mutex
	// mounts are the spec-level mounts of the last spec validated whole;
	// valid says one was.
	mounts []cdispec.Mount
	valid  bool
}

// check validates spec, whose encoding is in the file at tmpPath, the
// temporary file of the spec at specPath.
func (v *specValidator) check(specPath, tmpPath string, spec *cdispec.Spec) error {
	if !v.knows(spec.ContainerEdits.Mounts) {
		if _, err := cdiapi.ReadSpec(tmpPath, 0); err != nil {
			return err
		}
		v.remember(spec.ContainerEdits.Mounts)
		return nil
	}
	rest := *spec
	rest.ContainerEdits.Mounts = nil
	data, err := json.Marshal(&rest)
	if err != nil {
		return fmt.Errorf("encode CDI spec without its driver mounts: %w", err)
	}
	return readSpecData(specPath, data)
}

// knows reports whether mounts are those of a spec validated whole.
func (v *specValidator) knows(mounts []*cdispec.Mount) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.valid && slices.EqualFunc(v.mounts, mounts, func(a cdispec.Mount, b *cdispec.Mount) bool {
		return b != nil && reflect.DeepEqual(a, *b) // every field, those of later CDI versions too
	})
}

func (v *specValidator) remember(mounts []*cdispec.Mount) {
	kept := make([]cdispec.Mount, 0, len(mounts))
	for _, m := range mounts {
		if m == nil {
			return // never equal to a kept list: validated whole each time
		}
		c := *m
		c.Options = slices.Clone(m.Options)
		kept = append(kept, c)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.mounts, v.valid = kept, true
}

// readSpecData runs the CDI library's reader over data, in a temporary file
// beside specPath (which RemoveTemps finds should a crash leave it).
func readSpecData(specPath string, data []byte) (err error) {
	f, err := atomicfile.CreateTemp(specPath)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, os.Remove(f.Name())) }()
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", f.Name(), err)
	}
	_, err = cdiapi.ReadSpec(f.Name(), 0)
	return err
}
