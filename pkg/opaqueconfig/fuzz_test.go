package opaqueconfig_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/opaqueconfig"
)

// FuzzDecodeDefaultValidate feeds arbitrary bytes, seeded with the examples
// of both APIs and api/gpu/v1beta1's hostile configs, to
// DecodeDefaultValidate. It must never panic; an error comes without a
// config; and an accepted config, whichever API it was written in, is a
// valid, defaulted config of this driver's API that survives a round trip
// through JSON. Run with
//
//	go test ./pkg/opaqueconfig -run '^$' -fuzz FuzzDecodeDefaultValidate -fuzztime 60s
func FuzzDecodeDefaultValidate(f *testing.F) {
	var seeds []string
	for _, pattern := range []string{
		"../../api/gpu/v1beta1/testdata/*.*",
		"../../api/gpu/v1beta1/testdata/hostile/[^_]*",
		filepath.Join(nvidiaTestdata, "*.*"),
	} {
		files, err := filepath.Glob(pattern)
		if err != nil || len(files) == 0 {
			f.Fatalf("no seeds in %s: %v", pattern, err)
		}
		seeds = append(seeds, files...)
	}
	for _, name := range seeds {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := opaqueconfig.DecodeDefaultValidate(data)
		if err != nil {
			if cfg != nil {
				t.Fatalf("returned %#v along with error %v", cfg, err)
			}
			return
		}
		if gv := cfg.GetObjectKind().GroupVersionKind().GroupVersion(); gv != gpuv1beta1.GroupVersion {
			t.Fatalf("accepted config is of %s, not of this driver's API", gv)
		}
		if errs := cfg.Validate(); len(errs) > 0 {
			t.Fatalf("accepted config does not validate again: %v", errs)
		}
		defaulted := cfg.DeepCopyObject().(gpuv1beta1.Config)
		defaulted.Default()
		if !equality.Semantic.DeepEqual(cfg, defaulted) {
			t.Fatalf("Default changed an accepted config:\n%#v\n%#v", cfg, defaulted)
		}
		encoded, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("encode accepted config: %v", err)
		}
		again, err := opaqueconfig.DecodeDefaultValidate(encoded)
		if err != nil {
			t.Fatalf("accepted config fails after a round trip through %s: %v", encoded, err)
		}
		if !equality.Semantic.DeepEqual(cfg, again) {
			t.Fatalf("round trip through %s changed the config:\n%#v\n%#v", encoded, cfg, again)
		}
	})
}
