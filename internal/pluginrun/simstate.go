package pluginrun

import (
	"path/filepath"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// SimState opens the simulated machine's persisted state as the plugin of
// these dirs keeps it (pkg/nodeplugin's simulation), to read or change what
// exists on the "hardware" between plugin runs. The caller calls Init if it
// needs NVML handles.
func (d Dirs) SimState(machine, node string) (*nvmlsim.Machine, error) {
	return nvmlsim.New(machine, nvmlsim.WithSeed(node),
		nvmlsim.WithStateFile(filepath.Join(d.PluginData, "simulated-"+machine, "nvml-state.json")))
}
