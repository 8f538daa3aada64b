package cliflags

import (
	"testing"

	"github.com/spf13/pflag"
)

func TestApplyEnv(t *testing.T) {
	tests := map[string]struct {
		args    []string
		env     map[string]string
		want    string
		wantQPS float64
		wantErr bool
	}{
		"default":              {want: "gpu.dra.dev", wantQPS: 5},
		"env sets":             {env: map[string]string{"DRIVER_NAME": "x.dev", "KUBE_API_QPS": "50"}, want: "x.dev", wantQPS: 50},
		"flag wins over env":   {args: []string{"--driver-name=y.dev"}, env: map[string]string{"DRIVER_NAME": "x.dev"}, want: "y.dev", wantQPS: 5},
		"bad env value errors": {env: map[string]string{"KUBE_API_QPS": "fast"}, wantErr: true, want: "gpu.dra.dev", wantQPS: 5},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			driver := fs.String("driver-name", "gpu.dra.dev", "driver")
			qps := fs.Float64("kube-api-qps", 5, "qps")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := ApplyEnv(fs, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if *driver != tc.want || *qps != tc.wantQPS {
				t.Errorf("got driver %q qps %v, want %q %v", *driver, *qps, tc.want, tc.wantQPS)
			}
		})
	}
}
