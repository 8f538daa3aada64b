package kubeclient

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"k8s.io/client-go/rest"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://api.example:6443"}
users:
- name: u
  user: {token: "t"}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func TestRESTConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(file, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a cluster
	base := &rest.Config{Host: "https://base.example", QPS: 7, Burst: 9}
	tests := map[string]struct {
		args      []string
		base      *rest.Config
		wantHost  string
		wantQPS   float32
		wantBurst int
		wantErr   string
	}{
		"kubeconfig with the binary's defaults": {args: []string{"--kubeconfig=" + file}, wantHost: "https://api.example:6443", wantQPS: 50, wantBurst: 100},
		"flags set the rate limits":             {args: []string{"--kubeconfig=" + file, "--kube-api-qps=3", "--kube-api-burst=4"}, wantHost: "https://api.example:6443", wantQPS: 3, wantBurst: 4},
		"base replaces the kubeconfig":          {args: []string{"--kubeconfig=" + file}, base: base, wantHost: "https://base.example", wantQPS: 50, wantBurst: 100},
		"zero keeps the base's limits":          {args: []string{"--kube-api-qps=0", "--kube-api-burst=0"}, base: base, wantHost: "https://base.example", wantQPS: 7, wantBurst: 9},
		"missing kubeconfig":                    {args: []string{"--kubeconfig=" + filepath.Join(dir, "none")}, wantErr: `load kubeconfig "` + filepath.Join(dir, "none")},
		"not in a cluster":                      {wantErr: "no --kubeconfig given"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var o Options
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs, 50, 100, "QPS.")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			c, err := o.RESTConfig(tc.base, "test-agent")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Host != tc.wantHost || c.QPS != tc.wantQPS || c.Burst != tc.wantBurst || c.UserAgent != "test-agent" {
				t.Errorf("host %s, QPS %v, burst %d, user agent %q", c.Host, c.QPS, c.Burst, c.UserAgent)
			}
			if c == tc.base || base.QPS != 7 || base.UserAgent != "" {
				t.Error("the base configuration was modified")
			}
			if _, err := o.New(tc.base, "test-agent"); err != nil {
				t.Errorf("New: %v", err)
			}
		})
	}
}
