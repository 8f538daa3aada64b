package vocabulary

// Kind is what a device is: the value of its AttrType attribute, which the
// DeviceClasses select on, and the kind the plugin records for a prepared
// device.
type Kind string

// The device kinds this release publishes.
const (
	// KindGPU is a whole GPU, used exclusively.
	KindGPU Kind = "gpu"
	// KindMIG is a MIG device (a GPU instance and a compute instance).
	KindMIG Kind = "mig"
	// KindTimeSlice is a time-sliced share of a GPU.
	KindTimeSlice Kind = "timeslice"
	// KindMPS is an MPS share of a GPU.
	KindMPS Kind = "mps"
	// KindVFIO is a whole GPU bound to vfio-pci for a virtual machine
	// (passthrough), published only where the device policy allows it.
	KindVFIO Kind = "vfio"
)

// Kinds are the device kinds this release knows, in publication order.
func Kinds() []Kind { return []Kind{KindGPU, KindMIG, KindTimeSlice, KindMPS, KindVFIO} }

// Known reports whether k is a kind this release knows. A newer release may
// publish (and record) others.
func (k Kind) Known() bool {
	switch k {
	case KindGPU, KindMIG, KindTimeSlice, KindMPS, KindVFIO:
		return true
	}
	return false
}

// Shared reports whether devices of kind k are shares of a GPU, allocated
// to many claims at once.
func (k Kind) Shared() bool { return k == KindTimeSlice || k == KindMPS }
