package prepare

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/klog/v2"
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
