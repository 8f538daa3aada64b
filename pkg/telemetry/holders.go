package telemetry

import (
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// Holder is one user of a prepared device: the claim and, when known, the
// pod and container using it. A shared GPU has one holder per claim, pod
// and container.
type Holder struct {
	// Device is the DRA device name the claim was allocated: gpu-0,
	// gpu-0-ts, gpu-0-mps, gpu-0-mig-1g.10gb-6 or gpu-0-mig-gi2-ci0.
	Device    string
	Namespace string
	Claim     string
	// Pod and Container are empty when unknown.
	Pod       string
	Container string
}

// HolderSource tells the collector who holds which device. The driver
// implements it over its checkpoint.
type HolderSource interface {
	// Holders maps NVIDIA UUIDs to their holders: GPU-… for whole GPUs and
	// shares of them, MIG-… for MIG devices (the UUIDs a prepared device
	// hands to the container). It is called on every scrape.
	Holders() map[string][]Holder
}

// HolderFunc adapts a function to HolderSource.
type HolderFunc func() map[string][]Holder

// Holders implements HolderSource.
func (f HolderFunc) Holders() map[string][]Holder { return f() }

// Consumer is a pod, and when known one of its containers, using a claim.
type Consumer struct {
	Pod       string
	Container string
	// Requests, if set, limits the container to the devices allocated for
	// these requests of the claim; nil means the whole claim.
	Requests []string
}

// HoldersFromClaims builds the holder map from the checkpoint's claims.
// consumers returns the pods and containers using a claim (see
// Attribution); nil or an empty result yields one holder without a pod. A
// device gets one holder per container using it, and one without a
// container for a pod none of whose known containers uses it. Claims not
// completely prepared are skipped.
func HoldersFromClaims(claims []checkpoint.PreparedClaim, consumers func(types.UID) []Consumer) map[string][]Holder {
	out := map[string][]Holder{}
	for _, c := range claims {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		var users []Consumer
		if consumers != nil {
			users = consumers(c.UID)
		}
		if len(users) == 0 {
			users = []Consumer{{}}
		}
		for _, d := range c.Devices {
			holders := deviceHolders(c, d, users)
			for _, uuid := range d.UUIDs {
				out[uuid] = append(out[uuid], holders...)
			}
		}
	}
	return out
}

// deviceHolders returns the holders of one device of claim c.
func deviceHolders(c checkpoint.PreparedClaim, d checkpoint.PreparedDevice, users []Consumer) []Holder {
	holder := func(pod, container string) Holder {
		return Holder{Device: d.Device, Namespace: c.Namespace, Claim: c.Name, Pod: pod, Container: container}
	}
	var out []Holder
	covered := map[string]bool{}
	for _, u := range users {
		if usesRequest(u.Requests, d.Request) {
			out = append(out, holder(u.Pod, u.Container))
			covered[u.Pod] = true
		}
	}
	// The pod holds the device through its claim even if none of its
	// containers uses it.
	for _, u := range users {
		if !covered[u.Pod] {
			out = append(out, holder(u.Pod, ""))
			covered[u.Pod] = true
		}
	}
	return out
}
