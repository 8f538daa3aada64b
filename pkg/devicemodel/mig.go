package devicemodel

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/discovery"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// MIGDeviceName names a dynamic MIG device by parent, profile and placement:
// gpu-0-mig-1g10gb-me-6. Names are DNS labels, so "." goes and "+" becomes "-".
func MIGDeviceName(g *discovery.GPU, profile string, start uint32) string {
	p := strings.NewReplacer(".", "", "+", "-").Replace(profile)
	return fmt.Sprintf("%s-mig-%s-%d", g.CanonicalName(), p, start)
}

// dynamicMIGDevices are every profile × placement of a GPU, or of the
// profiles named in only (nil: all). Within a profile, placements are
// ordered from the highest start down: the allocator is first-fit, and the
// large profiles (4g, 7g) start at memory slice 0, so small ones filling
// from the top keep them possible longest.
func dynamicMIGDevices(g *discovery.GPU, only []string) []Published {
	var out []Published
	for i := range g.MIG.Profiles {
		p := &g.MIG.Profiles[i]
		if only != nil && !slices.Contains(only, p.Name) {
			continue
		}
		placements := slices.Clone(p.Placements)
		slices.SortFunc(placements, func(a, b mig.Placement) int { return int(b.Start) - int(a.Start) })
		for _, pl := range placements {
			out = append(out, Published{Device: migDevice(g, *p, pl), Kind: vocabulary.KindMIG, GPU: g, MIGProfile: p, Placement: pl})
		}
	}
	return out
}

func migDevice(g *discovery.GPU, p mig.Profile, pl mig.Placement) resourceapi.Device {
	attrs := gpuAttributes(g)
	attrs[vocabulary.AttrType] = kindAttr(vocabulary.KindMIG)
	attrs[vocabulary.AttrProfile] = stringAttr(p.Name)
	attrs[vocabulary.AttrParentUUID] = stringAttr(g.UUID)
	attrs[vocabulary.AttrParentMinor] = intAttr(g.Minor)
	attrs[vocabulary.AttrPlacementStart] = intAttr(int(pl.Start))

	consumed := map[string]resourceapi.Counter{}
	for i := pl.Start; i < pl.Start+pl.Size; i++ {
		consumed[vocabulary.MemorySliceCounter(int(i))] = count(1)
	}
	for name, n := range map[string]int{
		vocabulary.CounterComputeSlices: p.ComputeSlices, vocabulary.CounterDecoders: p.Decoders,
		vocabulary.CounterEncoders: p.Encoders, vocabulary.CounterJPEGEngines: p.JPEGs, vocabulary.CounterOFAEngines: p.OFAs,
	} {
		if n > 0 {
			consumed[name] = count(n)
		}
	}
	return resourceapi.Device{
		Name:             MIGDeviceName(g, p.Name, pl.Start),
		Attributes:       attrs,
		Capacity:         migCapacity(p),
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: CounterSetName(g), Counters: consumed}},
	}
}

func migCapacity(p mig.Profile) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		vocabulary.CapacityMemory:          bytesCapacity(p.MemoryBytes),
		vocabulary.CapacityMultiprocessors: countCapacity(p.Multiprocessors),
		vocabulary.CapacityCopyEngines:     countCapacity(p.CopyEngines),
		vocabulary.CapacityDecoders:        countCapacity(p.Decoders),
		vocabulary.CapacityEncoders:        countCapacity(p.Encoders),
		vocabulary.CapacityJPEGEngines:     countCapacity(p.JPEGs),
		vocabulary.CapacityOFAEngines:      countCapacity(p.OFAs),
	}
}

// StaticMIGDeviceName names a MIG device created out of band.
func StaticMIGDeviceName(g *discovery.GPU, inst mig.Instance) string {
	return fmt.Sprintf("%s-mig-gi%d-ci%d", g.CanonicalName(), inst.GIID, inst.CIID)
}

// staticMIGDevices are MIG devices an admin created (e.g. with mig-parted).
// They use no counters: the GPU publishes nothing else while they exist,
// and the driver never destroys them.
func staticMIGDevices(g *discovery.GPU, static []mig.Instance) []Published {
	var out []Published
	for i := range static {
		inst := &static[i]
		attrs := gpuAttributes(g)
		attrs[vocabulary.AttrType] = kindAttr(vocabulary.KindMIG)
		attrs[vocabulary.AttrProfile] = stringAttr(inst.Profile.Name)
		attrs[vocabulary.AttrParentUUID] = stringAttr(g.UUID)
		attrs[vocabulary.AttrParentMinor] = intAttr(g.Minor)
		attrs[vocabulary.AttrPlacementStart] = intAttr(int(inst.Placement.Start))
		attrs[vocabulary.AttrUUID] = stringAttr(inst.UUID)
		attrs[vocabulary.AttrStatic] = boolAttr(true)
		out = append(out, Published{Kind: vocabulary.KindMIG, GPU: g, StaticMIG: inst, Device: resourceapi.Device{
			Name:       StaticMIGDeviceName(g, *inst),
			Attributes: attrs,
			Capacity:   migCapacity(inst.Profile),
		}})
	}
	return out
}
