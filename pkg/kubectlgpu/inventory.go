package kubectlgpu

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Inventory is a driver's GPUs in the cluster and the claims holding them,
// indexed once: building it is linear in the number of devices, allocation
// results and pods.
type Inventory struct {
	// Driver is the DRA driver name.
	Driver string
	// Nodes publish devices of the driver; sorted by name.
	Nodes []*Node
	// Claims have devices of the driver allocated, or are pending with a
	// request for one of its DeviceClasses; sorted by namespace and name.
	Claims []*Claim

	nodes  map[string]*Node
	slices int // read by Load
}

// Node is a node whose pool publishes devices of the driver.
type Node struct {
	Name string
	// GPUs are sorted by minor number.
	GPUs []*GPU
	// Devices counts the published devices of the driver.
	Devices int
	// Unrecognized counts devices without a known type or GPU (minor or
	// parentMinor attribute); they are not shown.
	Unrecognized int
}

// GPU is one physical GPU and every device published for it.
type GPU struct {
	Node *Node
	// Name is gpu-<minor>, the name of its whole-GPU device and counter set.
	Name  string
	Minor int64

	UUID, ProductName, Architecture, CUDAComputeCapability string
	DriverVersion, CUDADriverVersion                       string
	PCIBusID, PCIeRoot, NVLinkDomain                       string
	// NUMANode is nil when the GPU has no NUMA affinity.
	NUMANode *int64
	// Memory is the GPU's memory; zero when only MIG devices are published.
	Memory                 resource.Quantity
	MIGCapable, MIGEnabled bool

	// CounterSet names the GPU's shared counters; Counters are their
	// totals, nil when none are published (a static-MIG GPU).
	CounterSet string
	Counters   map[string]resourceapi.Counter

	// Devices are in publication order, its passthrough device (gpu-N-vfio)
	// among them.
	Devices []*Device
	// Taints are those of any of its devices, each once.
	Taints []resourceapi.DeviceTaint
}

// Device is one published device of a GPU. It keeps what the reports need,
// not the API object, so a page of slices can be freed once read.
type Device struct {
	GPU *GPU
	// Name is the device name, unique in its pool.
	Name string
	// Type is the device's kind (its type attribute).
	Type vocabulary.Kind
	// Profile and PlacementStart describe a MIG device; Static marks one
	// created out of band.
	Profile        string
	PlacementStart int64
	Static         bool
	// Memory is the device's memory capacity; Shares the number of shares
	// a time-slicing or MPS device allows.
	Memory resource.Quantity
	Shares int64
	Taints []resourceapi.DeviceTaint
	// Holdings are the allocation results naming the device.
	Holdings []*Holding

	// consumes is what the device takes from its GPU's counter set, nil
	// when it uses no counters (a static MIG device).
	consumes []counterUse
}

// counterUse is an amount of one counter, compact: a DGX node has 224
// devices, and a map per device would outweigh the rest of the inventory.
type counterUse struct {
	name  string
	value int64
}

// Holding is one allocation result of a claim: a device (or a share of one)
// allocated for one request.
type Holding struct {
	Claim   *Claim
	Request string
	// Pool and DeviceName are as allocated; Device is nil when no current
	// slice publishes that device (it went away after allocation).
	Pool, DeviceName string
	Device           *Device
	// ShareID is set for an allocation of a shareable device.
	ShareID string
	// Consumed is the capacity a share consumes, by name without the
	// driver's domain.
	Consumed    map[string]resource.Quantity
	AdminAccess bool
	// Config is the driver's opaque configuration in effect for it.
	Config Config
}

// Claim is a ResourceClaim that uses the driver.
type Claim struct {
	Namespace, Name string
	UID             types.UID
	// Allocated says whether the scheduler allocated it; Deleting whether it
	// is being deleted.
	Allocated, Deleting bool
	// Node is where the claim's devices are: its pods' node, else the node
	// of the allocated devices' pool.
	Node string
	// Classes are the DeviceClasses its requests name.
	Classes []string
	// Pods are the pods it is reserved for, then pods that reference it but
	// are not (yet) reserved.
	Pods []PodRef
	// Holdings are its allocation results for the driver.
	Holdings []*Holding
}

// PodRef is a pod using a claim.
type PodRef struct {
	Name string `json:"name"`
	// Phase and Node are empty when pods could not be listed.
	Phase string `json:"phase,omitempty"`
	Node  string `json:"node,omitempty"`
	// Reserved says whether the claim is reserved for the pod (its
	// status.reservedFor names it).
	Reserved bool `json:"reserved"`
}

// Key is namespace/name.
func (c *Claim) Key() string { return c.Namespace + "/" + c.Name }

// Node returns the node of that name, or nil.
func (inv *Inventory) Node(name string) *Node { return inv.nodes[name] }
