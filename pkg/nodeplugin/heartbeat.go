package nodeplugin

import (
	"errors"
	"os"

	"k8s.io/client-go/kubernetes"

	"github.com/gpu-dra/gpu-dra-driver/pkg/heartbeat"
	"github.com/gpu-dra/gpu-dra-driver/pkg/liveness"
)

// heartbeat renews the node's heartbeat Lease while the checks of the DRA
// socket, NVML and the engine pass in p's rounds: the serving path a
// prepare takes.
// The registration socket is not needed to serve a registered plugin. An
// instance that does not own the node yet (a rolling update's new one,
// whose calls wait for the old) does not serve: owned says when it does.
func (c *Config) heartbeat(client kubernetes.Interface, p *liveness.Prober, owned func() bool) (*heartbeat.Heartbeat, error) {
	holder := c.PodName
	if holder == "" {
		holder, _ = os.Hostname()
	}
	return heartbeat.New(heartbeat.Options{
		Client: client.CoordinationV1(), Namespace: c.PodNamespace, NodeName: c.NodeName, Holder: holder,
		Period: c.HeartbeatPeriod,
		Serving: func() error {
			if !owned() {
				return errors.New("waiting to own the node from the instance before it (rolling update)")
			}
			return p.Passing(liveness.DRASocketCheck, liveness.NVMLCheck, liveness.EngineCheck)
		},
	})
}
