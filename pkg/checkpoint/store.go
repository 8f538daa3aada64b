package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
)

// Store loads and saves the checkpoint. Its methods must not be called
// concurrently; the driver serializes them (it holds one lock across
// load-modify-save anyway).
type Store interface {
	// Load returns the saved checkpoint, or an empty one if none was saved
	// yet. A file that cannot be trusted gives an error matching ErrCorrupt;
	// a file from a newer major format gives one matching
	// ErrUnsupportedVersion.
	Load(ctx context.Context) (*Checkpoint, error)
	// Save replaces the saved checkpoint with c. When Save returns, c is
	// durable; if the node crashes during Save, the file holds either the
	// previous or the new checkpoint, never a mix.
	Save(ctx context.Context, c *Checkpoint) error
}

// fileMode is the permission of the checkpoint file: it names pods' claims,
// which is nobody else's business on the node.
const fileMode = 0o600

type fileStore struct {
	path string
}

// NewFileStore returns a Store that keeps the checkpoint in the file at path.
// The directory must exist.
func NewFileStore(path string) Store {
	return &fileStore{path: path}
}

// Load implements Store. It also removes temporary files that a Save
// interrupted by a crash left next to the checkpoint.
func (s *fileStore) Load(ctx context.Context) (*Checkpoint, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)

	if err := atomicfile.RemoveTemps(s.path); err != nil {
		// Leftovers waste a little space but do no harm.
		logger.Error(err, "Failed to remove temporary checkpoint files", "path", s.path)
	}

	content, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		logger.V(2).Info("No checkpoint file, starting with an empty checkpoint", "path", s.path)
		return New(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint file %s: %w", s.path, err)
	}
	c, err := decode(s.path, content)
	if err != nil {
		return nil, err
	}
	logger.V(4).Info("Loaded checkpoint", "path", s.path, "claims", c.Len())
	return c, nil
}

// Save implements Store.
func (s *fileStore) Save(ctx context.Context, c *Checkpoint) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	content, err := encode(c)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(s.path, content, fileMode); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	klog.FromContext(ctx).V(4).Info("Saved checkpoint", "path", s.path, "claims", c.Len())
	return nil
}

// Quarantine copies the checkpoint file at path aside, to
// "<path>.corrupt-<UTC timestamp>", and returns the copy's name. The plugin
// calls it when Load reports ErrCorrupt, so that it can rebuild its state and
// start instead of failing on the same file forever, while the operator keeps
// the file for inspection.
//
// The file at path is left in place: the caller replaces it with the rebuilt
// checkpoint (Save is atomic), so a crash at any moment leaves either the
// corrupt file, which the next start quarantines again, or the rebuilt one,
// never no checkpoint at all (which would mean "nothing is prepared").
// Quarantining the same content again returns the existing copy.
func Quarantine(path string) (string, error) {
	return quarantine(path, time.Now())
}

func quarantine(path string, now time.Time) (string, error) {
	content, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("quarantine checkpoint file %s: %w", path, err)
	}
	if prev, ok := quarantinedCopy(path, content); ok {
		return prev, nil // a crash after the copy: already kept
	}
	base := path + ".corrupt-" + now.UTC().Format("20060102T150405Z")
	target := base
	for i := 2; ; i++ {
		_, err := os.Lstat(target)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("quarantine checkpoint file %s: %w", path, err)
		}
		// Quarantined twice within a second: keep both files.
		target = fmt.Sprintf("%s-%d", base, i)
	}
	if err := atomicfile.WriteFile(target, content, fileMode); err != nil {
		return "", fmt.Errorf("quarantine checkpoint file %s as %s: %w", path, target, err)
	}
	return target, nil
}

// quarantinedCopy returns an existing quarantined copy of path holding
// content.
func quarantinedCopy(path string, content []byte) (string, bool) {
	dir, base := filepath.Split(path)
	entries, err := os.ReadDir(filepath.Clean(dir))
	if err != nil {
		return "", false
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), base+".corrupt-") || !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, content) {
			return p, true
		}
	}
	return "", false
}

// Exists reports whether a checkpoint file exists at path. A missing file
// loads as an empty checkpoint; the driver needs to tell it apart from a
// saved empty one, because only the latter says that nothing is prepared.
func Exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, fmt.Errorf("stat checkpoint file %s: %w", path, err)
	}
}
