package mig

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MigMinorsPath is where the driver lists the minors of the MIG capability device nodes, relative
// to the root of the filesystem (or of a driver root).
const MigMinorsPath = "proc/driver/nvidia-caps/mig-minors"

// CapDevicePath is the container path of the nvidia-caps device node with the given minor.
func CapDevicePath(minor int) string {
	return fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor)
}

// CapDeviceNodes returns the device nodes a container needs, besides /dev/nvidia<gpuMinor> and
// /dev/nvidiactl, to use the MIG device of GPU instance giID and compute instance ciID on the GPU
// with minor number gpuMinor: the GPU-instance and compute-instance access capabilities,
// /dev/nvidia-caps/nvidia-cap<minor>. The minors come from <driverRoot>/proc/driver/nvidia-caps/
// mig-minors ("gpu<G>/gi<I>/access <minor>", "gpu<G>/gi<I>/ci<C>/access <minor>"). The paths are
// container paths; on the host they are under the driver root's dev directory.
func CapDeviceNodes(driverRoot string, gpuMinor int, giID, ciID uint32) ([]string, error) {
	path := filepath.Join(driverRoot, MigMinorsPath)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("MIG capability nodes of GPU %d GI %d CI %d: %w", gpuMinor, giID, ciID, err)
	}
	defer f.Close()
	minors, err := ParseMigMinors(f)
	if err != nil {
		return nil, fmt.Errorf("MIG capability nodes of GPU %d GI %d CI %d: %s: %w", gpuMinor, giID, ciID, path, err)
	}
	var out []string
	for _, capName := range []string{
		fmt.Sprintf("gpu%d/gi%d/access", gpuMinor, giID),
		fmt.Sprintf("gpu%d/gi%d/ci%d/access", gpuMinor, giID, ciID),
	} {
		minor, ok := minors[capName]
		if !ok {
			return nil, fmt.Errorf("MIG capability nodes of GPU %d GI %d CI %d: %s lists no %s", gpuMinor, giID, ciID, path, capName)
		}
		out = append(out, CapDevicePath(minor))
	}
	return out, nil
}

// ParseMigMinors parses the driver's mig-minors file into capability name ("config", "monitor",
// "gpu0/gi1/access", "gpu0/gi1/ci0/access") to device minor.
func ParseMigMinors(r io.Reader) (map[string]int, error) {
	out := map[string]int{}
	scanner := bufio.NewScanner(r)
	for line := 1; scanner.Scan(); line++ {
		text := strings.TrimSpace(scanner.Text())
		if text == "" {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 2 {
			return nil, fmt.Errorf("line %d: %q is not \"<capability> <minor>\"", line, text)
		}
		minor, err := strconv.Atoi(fields[1])
		if err != nil || minor < 0 {
			return nil, fmt.Errorf("line %d: %q: minor %q is not a number", line, text, fields[1])
		}
		out[fields[0]] = minor
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
