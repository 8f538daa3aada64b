package app

import (
	"strings"
	"testing"
)

// Validate names the flag at fault.
func TestConfigValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*Config)
		want   string // "" means valid
	}{
		"minimal":                 {func(*Config) {}, ""},
		"no node":                 {func(c *Config) { c.NodeName = "" }, "--node-name is required"},
		"relative host root":      {func(c *Config) { c.HostDriverRoot = "run/nvidia" }, "--host-driver-root"},
		"shm size with pods":      {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "1Gi" }, ""},
		"shm size zero":           {func(c *Config) { c.MPSShmSize = "0" }, ""},
		"shm size without pods":   {func(c *Config) { c.MPSShmSize = "1Gi" }, "--mps-shm-size needs --mps-daemon-image"},
		"shm size not a quantity": {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "lots" }, `--mps-shm-size="lots"`},
		"shm size negative":       {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "-1Gi" }, "must not be negative"},
		"unknown machine":         {func(c *Config) { c.Simulate = "dgx-z" }, `--simulate="dgx-z"`},
	} {
		t.Run(name, func(t *testing.T) {
			c := &Config{NodeName: "n1", DriverName: DefaultDriverName}
			tc.change(c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate() = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
