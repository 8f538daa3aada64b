package nvmlsim

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Withheld device nodes leave the driver roots written so far, stay out of
// later writes and of capability nodes made for new MIG instances, and come
// back when no longer withheld.
func TestWithholdDeviceNodes(t *testing.T) {
	m := started(t, "dgxa100")
	root := t.TempDir()
	if err := m.WriteDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	uvmOrCap := func(name string) bool {
		return strings.HasPrefix(name, "nvidia-uvm") || strings.HasPrefix(name, "nvidia-caps/nvidia-cap") && name != "nvidia-caps/nvidia-cap1" && name != "nvidia-caps/nvidia-cap2"
	}
	if err := m.WithholdDeviceNodes(uvmOrCap); err != nil {
		t.Fatal(err)
	}
	if err := m.WriteDriverRoot(root); err != nil { // a plugin restart
		t.Fatal(err)
	}
	d := migGPU(t, m, 1)
	threeG := profileByID(t, d, 9)
	gi := get(d.CreateGpuInstanceWithPlacement(&threeG, &nvml.GpuInstancePlacement{Start: 4, Size: 4})).must(t, "3g at 4")
	full := get(gi.GetComputeInstanceProfileInfo(2, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)).must(t, "3g CI")
	get(gi.CreateComputeInstance(&full)).must(t, "CI")
	capNode := fmt.Sprintf("nvidia-caps/nvidia-cap%d", ciAccessMinor(1, 2, 0))

	exists := func(name string) bool {
		_, err := os.Stat(filepath.Join(root, "dev", name))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		return err == nil
	}
	for name, want := range map[string]bool{"nvidia-uvm": false, "nvidia-uvm-tools": false, capNode: false, "nvidiactl": true, "nvidia1": true, "nvidia-caps/nvidia-cap1": true} {
		if got := exists(name); got != want {
			t.Errorf("while withheld: dev/%s exists = %v, want %v", name, got, want)
		}
	}
	if err := m.WithholdDeviceNodes(nil); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nvidia-uvm", "nvidia-uvm-tools", capNode} {
		if !exists(name) {
			t.Errorf("dev/%s not made once no longer withheld", name)
		}
	}
}

// SetIMEXChannels makes channel nodes in the driver roots written before
// and after it, on a machine that makes none of its own; a count below a
// machine's own changes nothing.
func TestSetIMEXChannels(t *testing.T) {
	for _, tc := range []struct {
		machine string
		set     int
		want    int
	}{
		{"dgxh100", 4, 4},
		{"gb200nvl72", 2, 64},
	} {
		m := started(t, tc.machine)
		before, after := t.TempDir(), t.TempDir()
		if err := m.WriteDriverRoot(before); err != nil {
			t.Fatal(err)
		}
		if err := m.SetIMEXChannels(tc.set); err != nil {
			t.Fatal(err)
		}
		if err := m.WriteDriverRoot(after); err != nil {
			t.Fatal(err)
		}
		for _, root := range []string{before, after} {
			got, _ := filepath.Glob(filepath.Join(root, "dev", "nvidia-caps-imex-channels", "channel*"))
			if len(got) != tc.want || m.IMEXChannels() != tc.want {
				t.Errorf("%s, %d set: %d channel nodes, IMEXChannels %d, want %d", tc.machine, tc.set, len(got), m.IMEXChannels(), tc.want)
			}
		}
	}
}
