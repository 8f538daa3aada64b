package v1beta1

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
)

// FuzzDecodeDefaultValidate feeds arbitrary bytes to DecodeDefaultValidate.
// It must never panic; an error must come without an object; and a config it
// accepts must be valid, stable under Default, usable by the plugin's
// accessors, and decode to the same config after JSON encoding.
//
// The seed corpus is testdata/*.yaml|json, the hostile configs of
// testdata/hostile and testdata/fuzz/FuzzDecodeDefaultValidate (the bad
// cases). Run with
//
//	go test ./api/gpu/v1beta1 -run '^$' -fuzz FuzzDecodeDefaultValidate -fuzztime 60s
func FuzzDecodeDefaultValidate(f *testing.F) {
	examples, err := filepath.Glob(filepath.Join("testdata", "*.*"))
	if err != nil {
		f.Fatal(err)
	}
	hostile, err := filepath.Glob(filepath.Join(hostileDir, "[^_]*"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range append(examples, hostile...) {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := DecodeDefaultValidate(data)
		if err != nil {
			if cfg != nil {
				t.Fatalf("DecodeDefaultValidate returned %#v along with error %v", cfg, err)
			}
			return
		}
		if errs := cfg.Validate(); len(errs) > 0 {
			t.Fatalf("accepted config does not validate again: %v", errs)
		}
		defaulted := cfg.DeepCopyObject().(Config)
		defaulted.Default()
		if !equality.Semantic.DeepEqual(cfg, defaulted) {
			t.Fatalf("Default changed an accepted config:\n%#v\n%#v", cfg, defaulted)
		}
		checkAccessors(t, cfg)

		encoded, err := json.Marshal(cfg)
		if err != nil {
			t.Fatalf("encode accepted config: %v", err)
		}
		again, err := DecodeDefaultValidate(encoded)
		if err != nil {
			t.Fatalf("accepted config fails after a round trip through %s: %v", encoded, err)
		}
		if !equality.Semantic.DeepEqual(cfg, again) {
			t.Fatalf("round trip through %s changed the config:\n%#v\n%#v", encoded, cfg, again)
		}
	})
}

// checkAccessors checks that the values the plugin turns into settings are
// all known in a valid, defaulted config.
func checkAccessors(t *testing.T, cfg Config) {
	t.Helper()
	var ts *TimeSlicingConfig
	var mps *MPSConfig
	switch c := cfg.(type) {
	case *GpuConfig:
		ts, mps = c.Sharing.TimeSlicingConfig, c.Sharing.MPSConfig
		if c.Sharing.Strategy == TimeSlicingStrategy && (ts == nil || ts.Interval == nil) {
			t.Fatal("defaulted TimeSlicing config has no interval")
		}
		if c.Sharing.Strategy == MPSStrategy && mps == nil {
			t.Fatal("defaulted MPS config has no mpsConfig")
		}
	case *MigDeviceConfig:
		mps = c.Sharing.MPSConfig
		if c.Sharing.Strategy == MPSStrategy && mps == nil {
			t.Fatal("defaulted MIG MPS config has no mpsConfig")
		}
	default:
		t.Fatalf("decoded an unexpected %T", cfg)
	}
	if ts != nil {
		if _, err := ts.Interval.ComputePolicyValue(); err != nil {
			t.Fatal(err)
		}
	}
	if mps != nil {
		if _, err := mps.ClientPriority.EnvValue(); err != nil {
			t.Fatal(err)
		}
	}
}
