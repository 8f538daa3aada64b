package nodeplugin

import (
	"os"

	"k8s.io/client-go/kubernetes"

	"github.com/gpu-dra/gpu-dra-driver/pkg/heartbeat"
	"github.com/gpu-dra/gpu-dra-driver/pkg/liveness"
)

// heartbeat renews the node's heartbeat Lease while the checks of the DRA
// socket and NVML pass in p's rounds: the serving path a prepare takes.
// The registration socket is not needed to serve a registered plugin.
func (c *Config) heartbeat(client kubernetes.Interface, p *liveness.Prober) (*heartbeat.Heartbeat, error) {
	holder := c.PodName
	if holder == "" {
		holder, _ = os.Hostname()
	}
	return heartbeat.New(heartbeat.Options{
		Client: client.CoordinationV1(), Namespace: c.PodNamespace, NodeName: c.NodeName, Holder: holder,
		Period:  c.HeartbeatPeriod,
		Serving: func() error { return p.Passing(liveness.DRASocketCheck, liveness.NVMLCheck) },
	})
}
