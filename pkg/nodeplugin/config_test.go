package nodeplugin

import (
	"strings"
	"testing"
	"time"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
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
		"negative stale grace":    {func(c *Config) { c.StaleClaimGracePeriod = -time.Second }, "--stale-claim-grace-period"},
		"relative pod resources":  {func(c *Config) { c.PodResourcesSocket = "kubelet.sock" }, "--pod-resources-socket"},
		"shm size with pods":      {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "1Gi" }, ""},
		"shm size zero":           {func(c *Config) { c.MPSShmSize = "0" }, ""},
		"shm size without pods":   {func(c *Config) { c.MPSShmSize = "1Gi" }, "--mps-shm-size needs --mps-daemon-image"},
		"shm size not a quantity": {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "lots" }, `--mps-shm-size="lots"`},
		"shm size negative":       {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "-1Gi" }, "must not be negative"},
		"shm size in mebibytes":   {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "1536Mi" }, ""},
		// The kernel would round these up to whole pages.
		"shm size with a fraction":  {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "1.5Mi" }, "--mps-shm-size=\"1.5Mi\": must be a whole number of mebibytes"},
		"shm size in decimal units": {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "1G" }, "use 953Mi or 954Mi"},
		"shm size in bytes":         {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "1000" }, "use 0Mi or 1Mi"},
		"shm size too large":        {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "80Ti" }, "at most 1Ti"},
		// ParseQuantity takes minutes on such exponents.
		"shm size with an exponent":      {func(c *Config) { c.MPSDaemonImage, c.MPSShmSize = "img", "1e-999999999" }, "must be a size such as"},
		"unknown machine":                {func(c *Config) { c.Simulate = "dgx-z" }, `--simulate="dgx-z"`},
		"node machines":                  {func(c *Config) { c.Simulate, c.SimulateNodeMachines = "dgxh100", "n2=l4x4,n1=dgxa100" }, ""},
		"node machines without simulate": {func(c *Config) { c.SimulateNodeMachines = "n1=l4x4" }, "--simulate-node-machines needs --simulate"},
		"node machines unknown machine":  {func(c *Config) { c.Simulate, c.SimulateNodeMachines = "dgxh100", "n2=l5" }, `entry "n2=l5": unknown simulated machine "l5"`},
		"node machines no node":          {func(c *Config) { c.Simulate, c.SimulateNodeMachines = "dgxh100", "=l4x4" }, `entry "=l4x4": want NODE=MACHINE`},
		"node machines in racks": {func(c *Config) {
			c.Simulate, c.SimulateNodeMachines = "gb200nvl72@r1", "n2=gb200nvl72@r1,n3=gb200nvl72@r2/2"
		}, ""},
		"node machine rack without fabric": {func(c *Config) { c.Simulate, c.SimulateNodeMachines = "dgxh100", "n2=l4x4@r1" }, `entry "n2=l4x4@r1": machine "l4x4@r1": l4x4 has no NVLink fabric`},
		"node machines node twice":         {func(c *Config) { c.Simulate, c.SimulateNodeMachines = "dgxh100", "n2=l4x4,n2=dgxa100" }, `node "n2" given twice`},
		"metrics auth delegated":           {func(c *Config) { c.MetricsAuth = MetricsAuthDelegated }, ""},
		"metrics auth unknown":             {func(c *Config) { c.MetricsAuth = "token" }, `--metrics-auth="token": want none or delegated`},
		"metrics cert without key":         {func(c *Config) { c.MetricsCertFile = "tls.crt" }, "--metrics-tls-key-file"},
		"metrics cert and key":             {func(c *Config) { c.MetricsCertFile, c.MetricsKeyFile = "tls.crt", "tls.key" }, ""},
		"local metrics on loopback":        {func(c *Config) { c.MetricsAddress, c.LocalMetricsAddress = ":9400", "127.0.0.1:9401" }, ""},
		"local metrics on IPv6 loopback":   {func(c *Config) { c.MetricsAddress, c.LocalMetricsAddress = ":9400", "[::1]:9401" }, ""},
		"local metrics on every address":   {func(c *Config) { c.MetricsAddress, c.LocalMetricsAddress = ":9400", ":9401" }, "must be a loopback IP"},
		"local metrics on a name":          {func(c *Config) { c.MetricsAddress, c.LocalMetricsAddress = ":9400", "localhost:9401" }, "must be a loopback IP"},
		"local metrics without a port":     {func(c *Config) { c.MetricsAddress, c.LocalMetricsAddress = ":9400", "127.0.0.1" }, "--local-metrics-address"},
		"local metrics without metrics":    {func(c *Config) { c.LocalMetricsAddress = "127.0.0.1:9401" }, "needs --metrics-address"},
		"device plugin check off":          {func(c *Config) { c.DevicePluginCheckPeriod = 0 }, ""},
		"device plugin check < 0":          {func(c *Config) { c.DevicePluginCheckPeriod = -time.Second }, "--device-plugin-check-period=-1s"},
		"pod uid":                          {func(c *Config) { c.PodUID = "0b5f2c3e-8d1a-4f6b-9c7e-2a4d6f8b0c1e" }, ""},
		"pod uid with a slash":             {func(c *Config) { c.PodUID = "../x" }, `--pod-uid="../x": must be a pod UID`},
		"heartbeat without namespace":      {func(c *Config) { c.HeartbeatPeriod = time.Second }, "--heartbeat-period=1s needs --pod-namespace"},
		"heartbeat":                        {func(c *Config) { c.HeartbeatPeriod, c.PodNamespace = time.Second, "ns" }, ""},
		"heartbeat negative":               {func(c *Config) { c.HeartbeatPeriod = -time.Second }, "--heartbeat-period=-1s: must not be negative"},
		"engine stall bound":               {func(c *Config) { c.EngineStallBound = 2 * time.Minute }, ""},
		"engine stall bound negative":      {func(c *Config) { c.EngineStallBound = -time.Second }, "--engine-stall-bound=-1s: must be positive"},
		"imex":                             {func(c *Config) { c.IMEX = IMEXConfig{NodeIP: "10.0.0.1", ServerPort: 50000, CmdPort: 50005} }, ""},
		"imex IPv6":                        {func(c *Config) { c.IMEX = IMEXConfig{NodeIP: "fd00::1", ServerPort: 50000, CmdPort: 50005} }, ""},
		"imex node ip not an IP":           {func(c *Config) { c.IMEX = IMEXConfig{NodeIP: "tray-1", ServerPort: 50000, CmdPort: 50005} }, `--imex-node-ip="tray-1": not an IP address`},
		"imex server port 0":               {func(c *Config) { c.IMEX = IMEXConfig{NodeIP: "10.0.0.1", CmdPort: 50005} }, "--imex-server-port=0: want 1..65535"},
		"imex cmd port too large":          {func(c *Config) { c.IMEX = IMEXConfig{NodeIP: "10.0.0.1", ServerPort: 50000, CmdPort: 70000} }, "--imex-cmd-port=70000"},
		"imex ports equal":                 {func(c *Config) { c.IMEX = IMEXConfig{NodeIP: "10.0.0.1", ServerPort: 50000, CmdPort: 50000} }, "are both 50000"},
		"imex poll negative":               {func(c *Config) { c.IMEX.PollPeriod = -time.Second }, "--imex-poll-period=-1s"},
	} {
		t.Run(name, func(t *testing.T) {
			c := &Config{NodeName: "n1", DriverName: vocabulary.DriverName}
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

// A node named in --simulate-node-machines simulates its own machine; others
// keep --simulate's.
func TestSimulateNodeMachines(t *testing.T) {
	for node, want := range map[string]string{"n1": "dgxa100", "n2": "l4x4", "n3": "dgxh100"} {
		c := &Config{NodeName: node, DriverName: vocabulary.DriverName, Simulate: "dgxh100", SimulateNodeMachines: "n2=l4x4,n1=dgxa100"}
		if err := c.Validate(); err != nil {
			t.Fatalf("%s: %v", node, err)
		}
		if c.Simulate != want {
			t.Errorf("node %s simulates %q, want %q", node, c.Simulate, want)
		}
	}
}
