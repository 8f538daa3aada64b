// Package pluginrun lays out the host directories and configuration of a
// real kubelet plugin (pkg/nodeplugin) on a simulated machine, shared by the
// two ways tests run it: in the test's process (pluginrun/inprocess) and as
// a child process that can be killed (pluginrun/childproc).
package pluginrun

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
)

// Dirs are the host directories a plugin instance uses; they outlive
// restarts of the plugin, like a node's.
type Dirs struct {
	Root, PluginData, Registrar, CDI string
}

// NewDirs lays out the directories under root (keep it short: unix socket
// paths are limited to 108 bytes).
func NewDirs(root string) (Dirs, error) {
	d := Dirs{
		Root:       root,
		PluginData: filepath.Join(root, "plugin"),
		Registrar:  filepath.Join(root, "reg"),
		CDI:        filepath.Join(root, "cdi"),
	}
	for _, dir := range []string{d.PluginData, d.Registrar, d.CDI} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return d, err
		}
	}
	return d, nil
}

// Config returns the plugin configuration for a simulated machine.
func (d Dirs) Config(machine, node string) *nodeplugin.Config {
	return &nodeplugin.Config{
		DriverName:    vocabulary.DriverName,
		NodeName:      node,
		PluginDataDir: d.PluginData,
		RegistrarDir:  d.Registrar,
		CDIDir:        d.CDI,
		MPSDir:        filepath.Join(d.Root, "mps"),
		Simulate:      machine,
		Out:           os.Stdout,
	}
}

// BuildMPSControl builds the simulated nvidia-cuda-mps-control
// (cmd/mps-control-sim) into dir and returns its path; the plugin finds it
// beside its own binary in a real deployment.
func BuildMPSControl(dir string) (string, error) {
	return buildCommand(dir, "mps-control-sim")
}

// BuildIMEX builds the simulated nvidia-imex and nvidia-imex-ctl
// (cmd/imex-sim) into dir and returns its path; the plugin finds it beside
// its own binary in a real deployment (nodeplugin.IMEXConfig.Daemon).
func BuildIMEX(dir string) (string, error) {
	return buildCommand(dir, "imex-sim")
}

// BuildLoadSim builds the simulated CUDA job (cmd/gpu-load-sim) into dir
// and returns its path.
func BuildLoadSim(dir string) (string, error) {
	return buildCommand(dir, "gpu-load-sim")
}

// buildCommand builds cmd/<name>, static, into dir.
func buildCommand(dir, name string) (string, error) {
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", out, "github.com/gpu-dra/gpu-dra-driver/cmd/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", name, err, msg)
	}
	return out, nil
}
