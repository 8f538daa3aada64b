package sharing

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNvidiaSMITimeSlicer checks the command line nvidia-smi gets and how
// its failures are classified.
func TestNvidiaSMITimeSlicer(t *testing.T) {
	dir := t.TempDir()
	smi := filepath.Join(dir, "nvidia-smi")
	argsLog := filepath.Join(dir, "args")
	// Records its arguments and exits with $EXIT_CODE.
	writeScript(t, smi, `printf '%s\n' "$*" >> "$ARGS_LOG"
echo "simulated output"
exit "${EXIT_CODE:-0}"
`)
	gpu := DeviceRef{UUID: "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c", Index: 3}

	tests := map[string]struct {
		path        string
		gpu         DeviceRef
		level       int
		exitCode    string
		wantArgs    string
		wantErr     bool
		unsupported bool
	}{
		"success": {
			path: smi, gpu: gpu, level: 2, exitCode: "0",
			wantArgs: "compute-policy -i GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c --set-timeslice=2",
		},
		"not supported (3)": {
			path: smi, gpu: gpu, level: 1, exitCode: "3",
			wantArgs: "compute-policy -i GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c --set-timeslice=1",
			wantErr:  true, unsupported: true,
		},
		"unknown subcommand (2)": {
			path: smi, gpu: gpu, level: 3, exitCode: "2",
			wantArgs: "compute-policy -i GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c --set-timeslice=3",
			wantErr:  true, unsupported: true,
		},
		"no permission (4)": {
			path: smi, gpu: gpu, level: 3, exitCode: "4",
			wantArgs: "compute-policy -i GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c --set-timeslice=3",
			wantErr:  true,
		},
		"missing nvidia-smi": {
			path: filepath.Join(dir, "missing"), gpu: gpu, level: 1,
			wantErr: true, unsupported: true,
		},
		"MIG device": {
			path: smi, gpu: DeviceRef{UUID: "MIG-9a7c1c4e-7d2b-5f37-a1b0-0c5a3e2f6d11", ParentUUID: gpu.UUID}, level: 1,
			wantErr: true, unsupported: true,
		},
		"level out of range": {
			path: smi, gpu: gpu, level: 4, wantErr: true,
		},
		"unsafe UUID": {
			path: smi, gpu: DeviceRef{UUID: "GPU-1 --set-timeslice=0"}, level: 1, wantErr: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_ = os.Remove(argsLog)
			s := &NvidiaSMITimeSlicer{Path: tc.path, Env: []string{"ARGS_LOG=" + argsLog, "EXIT_CODE=" + tc.exitCode}}
			err := s.SetTimeslice(testContext(t), tc.gpu, tc.level)
			if (err != nil) != tc.wantErr {
				t.Fatalf("SetTimeslice = %v, want error %v", err, tc.wantErr)
			}
			if got := errors.Is(err, ErrNotSupported); got != tc.unsupported {
				t.Errorf("errors.Is(%v, ErrNotSupported) = %v, want %v", err, got, tc.unsupported)
			}
			if tc.exitCode != "" && tc.exitCode != "0" && !strings.Contains(err.Error(), "simulated output") {
				t.Errorf("error %q does not carry nvidia-smi's output", err)
			}
			data, _ := os.ReadFile(argsLog)
			if got := strings.TrimSpace(string(data)); got != tc.wantArgs {
				t.Errorf("nvidia-smi arguments = %q, want %q", got, tc.wantArgs)
			}
		})
	}

	if _, err := (&NvidiaSMITimeSlicer{Path: smi}).Timeslice(testContext(t), gpu); !errors.Is(err, ErrLevelUnknown) {
		t.Errorf("Timeslice = %v, want ErrLevelUnknown", err)
	}
}
