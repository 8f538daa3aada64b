package sharing

import (
	"path/filepath"
	"testing"
)

func TestFindMPSControl(t *testing.T) {
	root := t.TempDir()
	if got := FindMPSControl(root); got != "" {
		t.Errorf("driver root without the program: %q, want none", got)
	}
	want := filepath.Join(root, MPSControlPath)
	writeScript(t, want, "exit 0\n")
	if got := FindMPSControl(root); got != want {
		t.Errorf("FindMPSControl = %q, want %q", got, want)
	}
}
