package hwcheck

import (
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
)

// Shape is what the structural comparison looks at on one GPU: the facts
// that make its model, the devices the device model publishes for it, and
// its MIG profile table. Nothing that differs between two GPUs of the same
// model (UUID, PCI address, index) is in it, except as an attribute's type.
type Shape struct {
	// GPU is the GPU's device name (gpu-<minor>), for messages.
	GPU string `json:"gpu"`
	// Model are the model's facts as discovery reports them.
	Model map[string]string `json:"model"`
	// Counters is the GPU's counter set: counter → quantity.
	Counters map[string]string `json:"counters"`
	// Devices are the published devices, keyed by their name with the
	// GPU's own name replaced by "gpu" (gpu-mig-1g18gb-6).
	Devices map[string]DeviceShape `json:"devices"`
	// MIG is the GPU-instance profile table; nil without MIG support.
	MIG []mig.Profile `json:"mig,omitempty"`
	// MIGTotals are the totals derived from it.
	MIGTotals *mig.Totals `json:"migTotals,omitempty"`
}

// DeviceShape is one published device.
type DeviceShape struct {
	// Attributes: qualified name → value type (string, int, bool, version).
	Attributes map[string]string `json:"attributes"`
	// Capacity: name → quantity.
	Capacity map[string]string `json:"capacity"`
	// Consumes: counter → quantity, of the GPU's counter set.
	Consumes map[string]string `json:"consumes"`
	// Profile and PlacementStart locate a dynamic MIG device.
	Profile        string `json:"profile,omitempty"`
	PlacementStart uint32 `json:"placementStart,omitempty"`
}

// ShapeOf builds the shape of g as the device model publishes it with
// opts (a single-GPU model: counter sets and names are per GPU).
func ShapeOf(g discovery.GPU, opts devicemodel.Options) Shape {
	s := Shape{
		GPU: g.CanonicalName(),
		Model: map[string]string{
			"productName":           g.ProductName,
			"brand":                 g.Brand,
			"architecture":          g.Architecture,
			"cudaComputeCapability": g.CUDAComputeCapability,
			"memoryBytes":           strconv.FormatUint(g.MemoryBytes, 10),
			"multiprocessors":       strconv.Itoa(g.Multiprocessors),
			"migCapable":            strconv.FormatBool(g.MIGCapable),
		},
		Counters: map[string]string{},
		Devices:  map[string]DeviceShape{},
	}
	if g.MIG != nil {
		s.MIG = g.MIG.Profiles
		totals := g.MIG.Totals
		s.MIGTotals = &totals
	}
	published, counterSets := devicemodel.Model([]discovery.GPU{g}, opts)
	for _, cs := range counterSets {
		for name, c := range cs.Counters {
			s.Counters[name] = c.Value.String()
		}
	}
	for _, p := range published {
		d := deviceShape(p.Device)
		if p.MIGProfile != nil {
			d.Profile, d.PlacementStart = p.MIGProfile.Name, p.Placement.Start
		}
		s.Devices[relativeName(s.GPU, p.Device.Name)] = d
	}
	return s
}

// relativeName replaces the GPU's own name in a device name by "gpu", so
// gpu-3-mig-1g18gb-6 on one machine matches gpu-0-mig-1g18gb-6 on another.
func relativeName(gpu, device string) string {
	if rest, ok := strings.CutPrefix(device, gpu); ok {
		return "gpu" + rest
	}
	return device
}

func deviceShape(d resourceapi.Device) DeviceShape {
	s := DeviceShape{Attributes: map[string]string{}, Capacity: map[string]string{}, Consumes: map[string]string{}}
	for name, a := range d.Attributes {
		s.Attributes[string(name)] = attributeType(a)
	}
	for name, c := range d.Capacity {
		s.Capacity[string(name)] = c.Value.String()
	}
	for _, cc := range d.ConsumesCounters {
		for name, c := range cc.Counters {
			s.Consumes[name] = c.Value.String()
		}
	}
	return s
}

func attributeType(a resourceapi.DeviceAttribute) string {
	var types []string
	if a.IntValue != nil {
		types = append(types, "int")
	}
	if a.BoolValue != nil {
		types = append(types, "bool")
	}
	if a.StringValue != nil {
		types = append(types, "string")
	}
	if a.VersionValue != nil {
		types = append(types, "version")
	}
	if len(types) != 1 {
		// The API allows exactly one; more or none is itself a finding.
		return fmt.Sprintf("invalid(%s)", strings.Join(types, ","))
	}
	return types[0]
}
