package prepare

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/atomicfile"
)

// Intent files record, beside the checkpoint, work that outlives a crash
// and that only the checkpoint would otherwise know of for a moment: a MIG
// instance being created (migintent.go), a GPU being bound to vfio-pci
// (vfiointent.go). Each is written atomically, so never half-written.

// forEachIntent calls fn with the path and content of each intent file in
// dir; what names them in log messages. A missing dir has none.
func forEachIntent(ctx context.Context, dir, what string, fn func(path string, data []byte)) {
	logger := klog.FromContext(ctx)
	files, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		logger.Error(err, "Cannot list intents; what they record stays as it is", "intents", what)
		return
	}
	for _, f := range files {
		if !f.Type().IsRegular() || !strings.HasSuffix(f.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, f.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			logger.Error(err, "Ignoring unreadable intent", "intents", what, "path", path)
			continue
		}
		fn(path, data)
	}
}

// writeIntent durably writes intent, as JSON, to path in dir before the
// work on device starts; what names the intents in errors.
func writeIntent(dir, path, what, device string, intent any) error {
	data, err := json.Marshal(intent)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("device %s: record %s intent: %w", device, what, err)
	}
	if err := atomicfile.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("device %s: record %s intent: %w", device, what, err)
	}
	return nil
}

// removeIntent removes the intent at path once its work is undone.
func removeIntent(path, what string) error {
	if err := atomicfile.Remove(path); err != nil {
		return fmt.Errorf("remove %s intent: %w", what, err)
	}
	return nil
}
