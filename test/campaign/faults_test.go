package campaign

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/internal/pluginrun"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nodeplugin"
	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
)

// faultPoints are the driver's fault points, each of which the campaign
// kills the plugin at.
func faultPoints() []string { return prepare.FaultPoints }

// File faults, applied while the plugin is down.
const (
	fileCheckpointDelete   = "checkpoint-delete"
	fileCheckpointCorrupt  = "checkpoint-corrupt"
	fileCheckpointTruncate = "checkpoint-truncate"
	fileSpecDelete         = "spec-delete"
	fileSpecCorrupt        = "spec-corrupt"
)

var fileFaults = []string{fileCheckpointDelete, fileCheckpointCorrupt, fileCheckpointTruncate, fileSpecDelete, fileSpecCorrupt}

func checkpointPath(dirs pluginrun.Dirs) string {
	return filepath.Join(dirs.PluginData, nodeplugin.CheckpointFile)
}

// loadCheckpoint reads the plugin's checkpoint from a copy: the store's
// Load removes the temporary files of saves it takes for interrupted ones,
// and would break a save the running plugin is making (a stale claim's
// release runs in the background).
func loadCheckpoint(dirs pluginrun.Dirs) (*checkpoint.Checkpoint, error) {
	data, err := os.ReadFile(checkpointPath(dirs))
	if errors.Is(err, fs.ErrNotExist) {
		return checkpoint.New(), nil
	}
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "campaign-checkpoint-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	path := filepath.Join(dir, nodeplugin.CheckpointFile)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return nil, err
	}
	return checkpoint.NewFileStore(path).Load(ctxBackground())
}

func statePath(dirs pluginrun.Dirs) string {
	return filepath.Join(dirs.PluginData, "simulated-"+machine, "nvml-state.json")
}

// applyFileFault damages the checkpoint or a CDI spec. It returns the
// claim UID whose spec it damaged (spec faults), and false when there was
// nothing to damage.
func applyFileFault(rng *rand.Rand, dirs pluginrun.Dirs, fault string) (string, bool, error) {
	switch fault {
	case fileCheckpointDelete:
		err := os.Remove(checkpointPath(dirs))
		if errors.Is(err, fs.ErrNotExist) {
			return "", false, nil
		}
		return "", err == nil, err
	case fileCheckpointCorrupt, fileCheckpointTruncate:
		ok, err := damage(rng, checkpointPath(dirs), fault == fileCheckpointTruncate)
		return "", ok, err
	default:
		specs, err := cdi.NewWriter(dirs.CDI, "", nil).ListClaimSpecs(ctxBackground())
		if err != nil || len(specs) == 0 {
			return "", false, err
		}
		spec := specs[rng.IntN(len(specs))]
		if fault == fileSpecDelete {
			return string(spec.Claim.UID), true, os.Remove(spec.Path)
		}
		ok, err := damage(rng, spec.Path, true)
		return string(spec.Claim.UID), ok, err
	}
}

// damage truncates the file to a random shorter length, or overwrites a
// run of bytes in it with garbage.
func damage(rng *rand.Rand, path string, truncate bool) (bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) || len(data) < 2 {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if truncate {
		return true, os.WriteFile(path, data[:rng.IntN(len(data)-1)+1], 0o600)
	}
	at := rng.IntN(len(data))
	for i := at; i < len(data) && i < at+8; i++ {
		data[i] = byte('!' + rng.IntN(90))
	}
	return true, os.WriteFile(path, data, 0o600)
}

// simMachine opens the simulated machine's persisted state, as the plugin
// left it.
func simMachine(dirs pluginrun.Dirs) (*nvmlsim.Machine, error) {
	m, err := nvmlsim.New(machine, nvmlsim.WithSeed(nodeName), nvmlsim.WithStateFile(statePath(dirs)))
	if err != nil {
		return nil, err
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("init simulated NVML: %w", ret)
	}
	return m, nil
}

// setLostOffline marks GPUs lost or back in the persisted state, while
// the plugin is down (a GPU that falls off the bus during a restart).
func setLostOffline(dirs pluginrun.Dirs, gpus map[int]bool) error {
	m, err := simMachine(dirs)
	if err != nil {
		return err
	}
	defer m.Shutdown()
	for g, lost := range gpus {
		if err := m.SetGPULost(g, lost); err != nil {
			return err
		}
	}
	return nil
}

// sendControl hands a command to the running plugin and waits until it
// applied it.
func sendControl(dirs pluginrun.Dirs, cmd nvmlCommand, done <-chan struct{}) error {
	data, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	path := filepath.Join(dirs.Root, controlFile)
	if err := os.WriteFile(path+".tmp", data, 0o644); err != nil {
		return err
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		select {
		case <-done:
			_ = os.Remove(path)
			return errors.New("plugin exited before it took the control command")
		case <-time.After(5 * time.Millisecond):
		}
	}
	_ = os.Remove(path)
	return errors.New("plugin did not take the control command within 10s")
}

// nvmlFaults are the NVML errors the campaign injects, each into one call
// on one GPU: the prepare or unprepare that makes the call fails.
var nvmlFaults = []struct {
	method string
	ret    nvml.Return
}{
	{"CreateGpuInstanceWithPlacement", nvml.ERROR_INSUFFICIENT_RESOURCES},
	{"GpuInstance.CreateComputeInstance", nvml.ERROR_UNKNOWN},
	{"GpuInstance.Destroy", nvml.ERROR_IN_USE},
	{"SetComputeMode", nvml.ERROR_UNKNOWN},
	{"SetMigMode", nvml.ERROR_IN_USE},
}
