package simhooks

import (
	"net/http"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// EventPath is where the plugin serves EventHandler, beside /metrics and
// behind the same guard (docs/telemetry.md).
const EventPath = "/simulate/event"

// EventHandler injects an NVML event into the simulated GPUs so demos can
// show a GPU going unhealthy: POST EventPath?gpu=0&xid=79 delivers a
// critical XID, &lost=true (or false) makes the GPU fall off the bus (or
// come back), &reset=true performs a GPU reset (nvmlsim.Machine.ResetGPU), and
// reboot=true (any gpu) a simulated node reboot: a new boot ID and every GPU
// reset (nvmlsim.Machine.Reboot). hang=true (any gpu) makes every NVML call
// block, as a wedged driver does, until hang=false (nvmlsim.Machine.Hang):
// the plugin's liveness probe then fails and the kubelet restarts it.
// hangsave=true (any gpu) hangs the plugin's checkpoint saves until
// hangsave=false (wedge, nil: refused), which only the engine's probe
// check sees.
func EventHandler(sim *nvmlsim.Machine, wedge *SaveWedge) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		if v := r.URL.Query().Get("hangsave"); v != "" {
			switch {
			case wedge == nil:
				http.Error(w, "hangsave: no checkpoint saves to hang here", http.StatusNotImplemented)
			case v == "true":
				wedge.Hang()
			case v == "false":
				wedge.Release()
			default:
				http.Error(w, "hangsave: want true or false", http.StatusBadRequest)
			}
			return
		}
		switch r.URL.Query().Get("hang") {
		case "true":
			sim.Hang()
			return
		case "false":
			sim.Release()
			return
		case "":
		default:
			http.Error(w, "hang: want true or false", http.StatusBadRequest)
			return
		}
		if r.URL.Query().Get("reboot") == "true" {
			if err := sim.Reboot(); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
			}
			return
		}
		gpu, err := strconv.Atoi(r.URL.Query().Get("gpu"))
		if err != nil || gpu < 0 || gpu >= sim.GPUCount() {
			http.Error(w, "gpu: want an index below "+strconv.Itoa(sim.GPUCount()), http.StatusBadRequest)
			return
		}
		switch q := r.URL.Query(); {
		case q.Get("lost") != "":
			err = sim.SetGPULost(gpu, q.Get("lost") == "true")
		case q.Get("reset") == "true":
			err = sim.ResetGPU(gpu)
		case q.Get("xid") != "":
			xid, perr := strconv.ParseUint(q.Get("xid"), 10, 64)
			if perr != nil {
				http.Error(w, "xid: "+perr.Error(), http.StatusBadRequest)
				return
			}
			sim.InjectEvent(gpu, nvml.EventTypeXidCriticalError, xid)
		default:
			http.Error(w, "give xid=N, lost=true|false, reset=true, reboot=true, hang=true|false or hangsave=true|false", http.StatusBadRequest)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
}
