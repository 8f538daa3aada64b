package sharing

import (
	"os"
	"path/filepath"
)

// MPSControlPath is where a driver installation has the MPS control
// program, relative to its root.
const MPSControlPath = "usr/bin/nvidia-cuda-mps-control"

// FindMPSControl returns the driver root's nvidia-cuda-mps-control, or ""
// when the driver has none (the node then publishes no MPS shares).
func FindMPSControl(driverRoot string) string {
	path := filepath.Join(driverRoot, MPSControlPath)
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	return path
}
