package health

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
)

// stateVersion is the version of the state file format. Fields are only
// added within a version and readers ignore unknown ones.
const stateVersion = 1

// stateFile is the persisted health state. Only GPUs with a condition are
// stored.
type stateFile struct {
	Version int `json:"version"`
	// BootID is the kernel boot ID when the file was written; a different
	// boot ID on load means the node rebooted, which resets every GPU.
	BootID string   `json:"bootID,omitempty"`
	GPUs   []Status `json:"gpus"`
}

// loadState reads the state file at path. A missing file is an empty state.
// A file that cannot be parsed is renamed aside (path.corrupt) and reported
// in the error together with an empty state, so the monitor can start.
func loadState(path string) (*stateFile, error) {
	empty := &stateFile{Version: stateVersion}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return empty, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read health state %s: %w", path, err)
	}
	var st stateFile
	err = json.Unmarshal(data, &st)
	if err == nil && st.Version != stateVersion {
		err = fmt.Errorf("unsupported version %d, want %d", st.Version, stateVersion)
	}
	if err != nil {
		aside := path + ".corrupt"
		if rerr := atomicfile.Rename(path, aside); rerr != nil {
			return nil, fmt.Errorf("health state %s is unreadable (%v) and cannot be moved aside: %w", path, err, rerr)
		}
		return empty, fmt.Errorf("health state %s is unreadable, moved to %s and starting with every GPU healthy: %w", path, aside, err)
	}
	return &st, nil
}

// saveState writes the conditions of states atomically to path.
func saveState(path, bootID string, states map[string]*Status) error {
	st := stateFile{Version: stateVersion, BootID: bootID, GPUs: []Status{}}
	for _, s := range states {
		if !s.Healthy() || s.Lost {
			st.GPUs = append(st.GPUs, s.clone())
		}
	}
	slices.SortFunc(st.GPUs, func(a, b Status) int { return strings.Compare(a.UUID, b.UUID) })
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode health state: %w", err)
	}
	if err := atomicfile.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("save health state: %w", err)
	}
	return nil
}
