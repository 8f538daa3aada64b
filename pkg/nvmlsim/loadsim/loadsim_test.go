package loadsim

import (
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	env := map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
	tests := map[string]struct {
		args    []string
		env     map[string]string
		want    Registration
		wantErr string
	}{
		"defaults from the container's environment": {
			env:  env,
			want: Registration{Devices: []string{"GPU-a", "GPU-b"}, SMPercent: 50, MemoryBytes: 1 << 30},
		},
		"MPS client": {
			args: []string{"--sm=30", "--memory=512Mi"},
			env:  map[string]string{"NVIDIA_VISIBLE_DEVICES": "MIG-x", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps"},
			want: Registration{Devices: []string{"MIG-x"}, SMPercent: 30, MemoryBytes: 512 << 20, MPS: true},
		},
		"devices flag":    {args: []string{"--devices=GPU-c"}, want: Registration{Devices: []string{"GPU-c"}, SMPercent: 50, MemoryBytes: 1 << 30}},
		"no devices":      {wantErr: "--devices"},
		"all devices":     {env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all"}, wantErr: "--devices"},
		"SM over 100":     {args: []string{"--sm=101"}, env: env, wantErr: "--sm=101"},
		"bad memory":      {args: []string{"--memory=lots"}, env: env, wantErr: `--memory="lots"`},
		"negative memory": {args: []string{"--memory=-1Gi"}, env: env, wantErr: "--memory"},
		"unknown flag":    {args: []string{"--gpu=0"}, env: env, wantErr: "gpu"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := parse(append([]string{"gpu-load-sim"}, tc.args...), func(k string) string { return tc.env[k] }, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parse = %v, want an error naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg.Registration, tc.want) || cfg.Socket != "/"+ProcessSocket {
				t.Errorf("parse = %+v, want %+v on the default socket", cfg, tc.want)
			}
		})
	}
}
