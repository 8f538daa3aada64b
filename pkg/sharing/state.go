package sharing

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
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

// shareState is a device's recorded state, with its sorted share IDs.
type shareState interface{ shareIDs() *[]string }

func (st *mpsState) shareIDs() *[]string { return &st.Shares }
func (st *tsState) shareIDs() *[]string  { return &st.Shares }

// dropShare removes share id from the device state recorded at path and
// saves what remains. last says the device's last share is gone: the state
// (read into st, with no shares) is then not saved, for the caller to undo
// the device's setup and remove it. An unknown state or share is no change.
func dropShare(path string, st shareState, id string) (last bool, err error) {
	found, err := readState(path, st)
	if err != nil || !found {
		return false, err
	}
	shares, removed := removeShare(*st.shareIDs(), id)
	*st.shareIDs() = shares
	switch {
	case len(shares) == 0:
		return true, nil
	case !removed:
		return false, nil
	default:
		return false, writeState(path, st)
	}
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

// reconcileDir is the reconcile both managers make over their state
// directory after a restart. visit brings one entry in line with the live
// shares (ids: share IDs by device UUID) and returns the device UUID whose
// state the entry holds ("" when it holds none, or none that could be
// read); then stateless is called, in UUID order, for each device that has
// live shares but no state. Errors of one entry or device do not stop the
// others; they are returned in errs. err is set, and nothing done, when dir
// cannot be listed.
func reconcileDir(dir string, live []ShareRef,
	visit func(e fs.DirEntry, ids map[string][]string) (uuid string, err error),
	stateless func(dev DeviceRef, shares []string) error,
) (errs []error, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	ids, devices := liveShares(live)
	known := map[string]bool{}
	for _, e := range entries {
		uuid, err := visit(e, ids)
		if uuid != "" {
			known[uuid] = true
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	// In UUID order: a restart handles the devices, and reports their
	// errors, the same way every time.
	for _, uuid := range slices.Sorted(maps.Keys(ids)) {
		if known[uuid] {
			continue
		}
		if err := stateless(devices[uuid], ids[uuid]); err != nil {
			errs = append(errs, err)
		}
	}
	return errs, nil
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
