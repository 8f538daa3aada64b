package sharing

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
)

// stateVersion is the format version of the managers' state files. Fields
// are only added; readers ignore fields they do not know.
const stateVersion = 1

// readState reads a JSON state file into v. It reports false when the file
// does not exist.
func readState(path string, v any) (bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read sharing state: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return false, fmt.Errorf("parse sharing state %s: %w", path, err)
	}
	return true, nil
}

// writeState atomically replaces a JSON state file.
func writeState(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode sharing state %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write sharing state: %w", err)
	}
	return nil
}

// addShare adds id to a sorted set of share IDs and reports whether it was
// new.
func addShare(shares []string, id string) ([]string, bool) {
	i, found := slices.BinarySearch(shares, id)
	if found {
		return shares, false
	}
	return slices.Insert(shares, i, id), true
}

// removeShare removes id from a sorted set of share IDs and reports whether
// it was there.
func removeShare(shares []string, id string) ([]string, bool) {
	i, found := slices.BinarySearch(shares, id)
	if !found {
		return shares, false
	}
	return slices.Delete(shares, i, i+1), true
}

// liveShares groups the live shares by device UUID, as sorted sets.
func liveShares(live []ShareRef) (map[string][]string, map[string]DeviceRef) {
	ids := map[string][]string{}
	devices := map[string]DeviceRef{}
	for _, s := range live {
		ids[s.Device.UUID], _ = addShare(ids[s.Device.UUID], s.ID)
		devices[s.Device.UUID] = s.Device
	}
	return ids, devices
}

// reconcileEntries is the walk both managers' Reconcile make over their
// state directory after a restart: visit brings one entry in line with the
// live shares and returns the device UUID whose state the entry holds (""
// when it holds none, or none that could be read). Errors of one entry do
// not stop the walk; they are joined in errs. known is nil and err set only
// when dir cannot be listed.
func reconcileEntries(dir string, visit func(fs.DirEntry) (uuid string, err error)) (known map[string]bool, errs []error, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", dir, err)
	}
	known = map[string]bool{}
	for _, e := range entries {
		uuid, err := visit(e)
		if uuid != "" {
			known[uuid] = true
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return known, errs, nil
}

// intersect returns the elements of the sorted set a that are in the sorted
// set b.
func intersect(a, b []string) []string {
	var out []string
	for _, s := range a {
		if _, ok := slices.BinarySearch(b, s); ok {
			out = append(out, s)
		}
	}
	return out
}

func ptrTo[T any](v T) *T { return &v }

// removeTemps removes temporary files an interrupted state write left in
// dir.
func removeTemps(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if atomicfile.IsTemp(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
