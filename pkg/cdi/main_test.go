package cdi

import (
	"fmt"
	"os"
	"testing"
)

// testMPSDir stands for the MPS pipe directory the plugin makes before it
// writes a spec that mounts it: a device mount's host path must exist then.
var testMPSDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cdi-mps-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testMPSDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
