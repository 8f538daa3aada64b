package telemetry

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
	// Shared marks a share of a device (time-slicing, MPS) that others may
	// hold too: the dcgm-compatible series then show the holder's own use.
	Shared bool
	// PodUID and ContainerIDs, when known, let the collector attribute the
	// processes on the device (ProcessOwners) to this holder: the pod's
	// UID and the runtime IDs the container has had (pod status).
	PodUID       string
	ContainerIDs []string
	// MemoryLimitBytes is the device memory the holder's share limits its
	// containers to or grants them (an MPS share's pinned memory limit, a
	// time-slice share's memory capacity); 0 when none is known, as for
	// whole GPUs and MIG devices, whose limit is the device's memory.
	MemoryLimitBytes int64
}

// HolderSource tells the collector who holds which device. The prepare
// engine implements it over its checkpoint and pkg/podattribution.
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
