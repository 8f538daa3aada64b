package devicemodel

import (
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// MaxSpareGPUs bounds reserve.spareGPUs: more than a node has GPUs is a typo.
const MaxSpareGPUs = 64

// ReservePolicy is the reserve policy: with SpareGPUs (K) above 0 a node
// publishes the MIG placements and shares of a GPU only while the GPU is
// partitioned or shared (an allocated or prepared claim holds a MIG
// device or share of it) or is one of K spare GPUs (free GPUs, chosen once
// and kept until used; pkg/reserve). Whole GPUs are always published. The
// scheduler's allocator checks every published device per claim, so a
// node with few partitioned GPUs costs it much less; what it gives up is
// in docs/device-model.md ("Reserve policy").
type ReservePolicy struct {
	// SpareGPUs is K: how many free GPUs publish their MIG placements and
	// shares. 0 (the default) turns the reserve policy off: every GPU
	// publishes everything, as without it.
	SpareGPUs int `json:"spareGPUs,omitempty"`
	// HoldSeconds is how long a GPU keeps publishing its MIG placements
	// and shares after it stopped qualifying, so that an allocation the
	// scheduler made before the node saw it keeps its device published
	// (0: DefaultReserveHoldSeconds). Raise it where the scheduler's
	// binding cycles or the API server's watches lag longer.
	HoldSeconds int `json:"holdSeconds,omitempty"`
}

// DefaultReserveHoldSeconds is the reserve policy's hold when the policy
// gives none.
const DefaultReserveHoldSeconds = 30

// MaxReserveHoldSeconds bounds reserve.holdSeconds: an hour of hold
// publishes what the policy is meant to hide.
const MaxReserveHoldSeconds = 3600

// Hold is the hold as a duration.
func (r ReservePolicy) Hold() time.Duration {
	if r.HoldSeconds == 0 {
		return DefaultReserveHoldSeconds * time.Second
	}
	return time.Duration(r.HoldSeconds) * time.Second
}

// Enabled reports whether the reserve policy hides anything.
func (r ReservePolicy) Enabled() bool { return r.SpareGPUs > 0 }

func (r ReservePolicy) validate() error {
	if r.SpareGPUs < 0 || r.SpareGPUs > MaxSpareGPUs {
		return fmt.Errorf("reserve.spareGPUs: %d is not in 0..%d (0 turns the reserve policy off)", r.SpareGPUs, MaxSpareGPUs)
	}
	if r.HoldSeconds < 0 || r.HoldSeconds > MaxReserveHoldSeconds {
		return fmt.Errorf("reserve.holdSeconds: %d is not in 0..%d (0: %d)", r.HoldSeconds, MaxReserveHoldSeconds, DefaultReserveHoldSeconds)
	}
	return nil
}

// ReservableGPU returns the GPU (its counter set name) of a device the
// reserve policy may hide: a dynamic MIG placement or a share. Whole GPUs,
// passthrough devices and static MIG devices (which consume no counters)
// are never hidden.
func ReservableGPU(d *resourceapi.Device) (string, bool) {
	if len(d.ConsumesCounters) == 0 {
		return "", false
	}
	kind := vocabulary.Kind("")
	if a, ok := d.Attributes[vocabulary.AttrType]; ok && a.StringValue != nil {
		kind = vocabulary.Kind(*a.StringValue)
	}
	if kind != vocabulary.KindMIG && !kind.Shared() {
		return "", false
	}
	return d.ConsumesCounters[0].CounterSet, true
}

// DeviceGPU returns the GPU (its counter set name) a device consumes
// counters of; false for a device that consumes none.
func DeviceGPU(d *resourceapi.Device) (string, bool) {
	if len(d.ConsumesCounters) == 0 {
		return "", false
	}
	return d.ConsumesCounters[0].CounterSet, true
}

// GPUUse is what claims hold of a pool, per GPU (counter set name).
type GPUUse struct {
	// GPUs lists the GPUs whose devices the reserve policy may hide, in
	// publication order.
	GPUs []string
	// Partitioned GPUs have a MIG device or share held.
	Partitioned map[string]bool
	// Busy GPUs have any device held (whole, MIG, share, passthrough).
	Busy map[string]bool
}

// UseOf says, per GPU of pool, whether the held devices (allocated or
// prepared, by name) partition it or make it busy.
func UseOf(res resourceslice.DriverResources, pool string, held map[string]bool) GPUUse {
	u := GPUUse{Partitioned: map[string]bool{}, Busy: map[string]bool{}}
	listed := map[string]bool{}
	for _, s := range res.Pools[pool].Slices {
		for i := range s.Devices {
			d := &s.Devices[i]
			if gpu, ok := ReservableGPU(d); ok && !listed[gpu] {
				listed[gpu] = true
				u.GPUs = append(u.GPUs, gpu)
			}
			if !held[d.Name] {
				continue
			}
			if gpu, ok := DeviceGPU(d); ok {
				u.Busy[gpu] = true
			}
			if gpu, ok := ReservableGPU(d); ok {
				u.Partitioned[gpu] = true
			}
		}
	}
	return u
}

// Reserve returns res without the MIG placements and shares of the GPUs
// of pool that show does not name. Slices keep their place and number,
// even when left empty (as with Withdraw), so a change of what is shown on
// one GPU changes only that GPU's slice. res is not modified.
func Reserve(res resourceslice.DriverResources, pool string, show map[string]bool) resourceslice.DriverResources {
	return keepDevices(res, pool, func(d *resourceapi.Device) bool {
		gpu, ok := ReservableGPU(d)
		return !ok || show[gpu]
	})
}
