package simhooks

import (
	"fmt"
	"os"
	"path/filepath"
)

// IMEXProgram is the simulated nvidia-imex and nvidia-imex-ctl
// (cmd/imex-sim), installed beside the plugin binary.
const IMEXProgram = "imex-sim"

// IMEX returns the simulated IMEX program beside the running executable, or
// "" when it is not installed there.
func IMEX() string { return besideExecutable(IMEXProgram) }

// InstallIMEX links program (cmd/imex-sim) into a simulated driver root as
// usr/bin/nvidia-imex and usr/bin/nvidia-imex-ctl, where a driver
// installation has them: the program acts as the one its name says.
func InstallIMEX(driverRoot, program string) error {
	dir := filepath.Join(driverRoot, "usr/bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, name := range []string{"nvidia-imex", "nvidia-imex-ctl"} {
		link := filepath.Join(dir, name)
		if target, err := os.Readlink(link); err == nil && target == program {
			continue
		}
		_ = os.Remove(link)
		if err := os.Symlink(program, link); err != nil {
			return fmt.Errorf("install simulated %s: %w", name, err)
		}
	}
	return nil
}
