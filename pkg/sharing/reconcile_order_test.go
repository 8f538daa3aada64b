package sharing

import (
	"errors"
	"io/fs"
	"slices"
	"testing"
)

// The devices left without state are handled in UUID order, so a restart
// starts their daemons, and reports their errors, the same way every time.
func TestReconcileDirStatelessInUUIDOrder(t *testing.T) {
	var live []ShareRef
	for _, uuid := range []string{"GPU-d", "GPU-a", "MIG-c", "GPU-b", "GPU-e"} {
		live = append(live, ShareRef{Device: DeviceRef{UUID: uuid}, ID: "s-" + uuid})
	}
	want := []string{"GPU-a", "GPU-b", "GPU-d", "GPU-e", "MIG-c"}
	for range 20 {
		var order []string
		errs, err := reconcileDir(t.TempDir(), live,
			func(fs.DirEntry, map[string][]string) (string, error) { return "", nil },
			func(dev DeviceRef, _ []string) error {
				order = append(order, dev.UUID)
				return errors.New(dev.UUID)
			})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(order, want) {
			t.Fatalf("stateless devices handled in the order %v, want %v", order, want)
		}
		if got := errors.Join(errs...).Error(); got != "GPU-a\nGPU-b\nGPU-d\nGPU-e\nMIG-c" {
			t.Fatalf("errors %q, want them in UUID order", got)
		}
	}
}
