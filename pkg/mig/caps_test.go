package mig

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCapDeviceNodes(t *testing.T) {
	ctx := testContext(t)
	m := newMachine(t, "dgxh100")
	root := t.TempDir()
	if err := m.WriteDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		gpu       int
		profileID uint32
		placement Placement
		// want follows the driver's layout: config 1, monitor 2, then per GPU 15 GPU instances of
		// 9 minors (gi access, ci0..ci7 access), e.g. gpu2/gi2/access = 3 + 2*135 + 2*9 = 291.
		want []string
	}{
		"GPU 0 7g.80gb (GI 0)": {gpu: 0, profileID: 0, placement: Placement{0, 8},
			want: []string{"/dev/nvidia-caps/nvidia-cap3", "/dev/nvidia-caps/nvidia-cap4"}},
		"GPU 2 3g.40gb at 4 (GI 2)": {gpu: 2, profileID: 9, placement: Placement{4, 4},
			want: []string{"/dev/nvidia-caps/nvidia-cap291", "/dev/nvidia-caps/nvidia-cap292"}},
		"GPU 7 1g.10gb at 6 (GI 13)": {gpu: 7, profileID: 19, placement: Placement{6, 1},
			want: []string{"/dev/nvidia-caps/nvidia-cap1065", "/dev/nvidia-caps/nvidia-cap1066"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dev := device(t, m, tc.gpu)
			inst, err := Create(ctx, dev, tc.profileID, tc.placement)
			if err != nil {
				t.Fatal(err)
			}
			minor, ret := dev.GetMinorNumber()
			if ret != 0 {
				t.Fatal(ret)
			}
			got, err := CapDeviceNodes(root, minor, inst.GIID, inst.CIID)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("CapDeviceNodes(GPU %d, GI %d, CI %d) = %q, want %q", minor, inst.GIID, inst.CIID, got, tc.want)
			}
			// The simulation creates the nodes of existing instances in its driver root.
			for _, p := range got {
				if _, err := os.Stat(filepath.Join(root, p)); err != nil {
					t.Errorf("node %s: %v", p, err)
				}
			}
		})
	}

	if _, err := CapDeviceNodes(root, 0, 15, 0); err == nil || !strings.Contains(err.Error(), "gpu0/gi15/access") {
		t.Errorf("CapDeviceNodes of GI 15: %v, want an error naming the capability", err)
	}
	if _, err := CapDeviceNodes(t.TempDir(), 0, 0, 0); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("CapDeviceNodes without mig-minors: %v, want ErrNotExist", err)
	}
}

func TestParseMigMinors(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    map[string]int
		wantErr string
	}{
		"driver format": {
			in:   "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\n\n",
			want: map[string]int{"config": 1, "monitor": 2, "gpu0/gi0/access": 3, "gpu0/gi0/ci0/access": 4},
		},
		"empty":          {in: "", want: map[string]int{}},
		"missing minor":  {in: "config 1\nmonitor\n", wantErr: "line 2"},
		"minor not int":  {in: "config one\n", wantErr: "line 1"},
		"negative minor": {in: "config -1\n", wantErr: "line 1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseMigMinors(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %d, want %d", k, got[k], v)
				}
			}
		})
	}
}
