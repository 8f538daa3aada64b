package telemetry

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// Holder is one user of a prepared device: the claim and, when known, the
// pod and container using it. A shared GPU has one holder per claim (and
// pod).
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

// Consumer is a pod (and container, if known) using a claim.
type Consumer struct {
	Pod       string
	Container string
}

// ConsumersOf returns the pods a claim is reserved for
// (status.reservedFor entries of resource "pods"). The container is left
// empty: the claim does not say which container of the pod uses it.
func ConsumersOf(claim *resourceapi.ResourceClaim) []Consumer {
	var out []Consumer
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup == "" && r.Resource == "pods" {
			out = append(out, Consumer{Pod: r.Name})
		}
	}
	return out
}

// HoldersFromClaims builds the holder map from the checkpoint's claims.
// consumers returns the pods using a claim (e.g. recorded with ConsumersOf
// at prepare); nil or an empty result yields one holder without a pod.
// Claims not completely prepared are skipped.
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
			for _, uuid := range d.UUIDs {
				for _, u := range users {
					out[uuid] = append(out[uuid], Holder{
						Device: d.Device, Namespace: c.Namespace, Claim: c.Name,
						Pod: u.Pod, Container: u.Container,
					})
				}
			}
		}
	}
	return out
}
