package simhooks

import (
	"os"
	"path/filepath"
)

// MPSControlProgram is the simulated nvidia-cuda-mps-control
// (cmd/mps-control-sim), installed beside the plugin binary.
const MPSControlProgram = "mps-control-sim"

// MPSControl returns the simulated MPS control program beside the running
// executable, or "" when it is not installed there.
func MPSControl() string { return besideExecutable(MPSControlProgram) }

// besideExecutable returns program in the running executable's directory,
// or "" when it is not there.
func besideExecutable(program string) string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	path := filepath.Join(filepath.Dir(exe), program)
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	return path
}
