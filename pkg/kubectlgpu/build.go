package kubectlgpu

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Build indexes src into an Inventory for driver. Only the newest
// generation of each pool counts, as for the scheduler.
func Build(driver string, src *Source) *Inventory {
	b := newBuilder(driver, src.Claims)
	b.addSlices(src.Slices)
	return b.finish(src)
}

// builder reads slices a page at a time and keeps only what the reports
// need, so that the pages (about 1.4 MB of objects per DGX node) can be
// freed as the list goes on.
type builder struct {
	inv    *Inventory
	domain *domain
	// allocated are the devices the claims name; only those need finding
	// by name, which keeps that index as small as the claims.
	allocated map[deviceKey]bool
	parts     map[poolGeneration]*poolPart
	// names interns counter names, so the devices do not keep the pages'
	// copies alive.
	names map[string]string
	// arena holds the counter uses of the slice being read: one
	// allocation per slice instead of one per device.
	arena []counterUse
}

type deviceKey struct{ pool, device string }

type poolGeneration struct {
	pool       string
	generation int64
}

// poolPart is what one generation of a pool publishes.
type poolPart struct {
	node                  string
	gpus                  map[int64]*GPU
	order                 []*GPU
	counters              map[string]map[string]resourceapi.Counter
	devices, unrecognized int
	named                 map[string]*Device
}

func newBuilder(driver string, claims []resourceapi.ResourceClaim) *builder {
	b := &builder{
		inv:       &Inventory{Driver: driver, nodes: map[string]*Node{}},
		domain:    newDomain(driver),
		allocated: map[deviceKey]bool{},
		parts:     map[poolGeneration]*poolPart{},
		names:     map[string]string{},
	}
	for i := range claims {
		if alloc := claims[i].Status.Allocation; alloc != nil {
			for _, r := range alloc.Devices.Results {
				if r.Driver == driver {
					b.allocated[deviceKey{r.Pool, r.Device}] = true
				}
			}
		}
	}
	return b
}

// addSlices reads a page of slices; it keeps no reference to the page
// beyond maps of counters and the taint lists.
func (b *builder) addSlices(page []resourceapi.ResourceSlice) {
	for i := range page {
		s := &page[i]
		if s.Spec.Driver != b.inv.Driver {
			continue
		}
		key := poolGeneration{s.Spec.Pool.Name, s.Spec.Pool.Generation}
		part := b.parts[key]
		if part == nil {
			part = &poolPart{node: sliceNode(s), gpus: map[int64]*GPU{},
				counters: map[string]map[string]resourceapi.Counter{}, named: map[string]*Device{}}
			b.parts[key] = part
		}
		for _, cs := range s.Spec.SharedCounters {
			part.counters[cs.Name] = cs.Counters
		}
		devs := make([]Device, len(s.Spec.Devices)) // one allocation per slice
		uses := 0
		for j := range s.Spec.Devices {
			for _, c := range s.Spec.Devices[j].ConsumesCounters {
				uses += len(c.Counters)
			}
		}
		b.arena = make([]counterUse, 0, uses)
		for j := range s.Spec.Devices {
			d := &s.Spec.Devices[j]
			part.devices++
			if !b.addDevice(&devs[j], part, d) {
				part.unrecognized++
				continue
			}
			if b.allocated[deviceKey{key.pool, d.Name}] {
				part.named[d.Name] = &devs[j]
			}
		}
	}
}

// sliceNode is the node a slice's pool belongs to: the driver publishes one
// pool per node, named after it.
func sliceNode(s *resourceapi.ResourceSlice) string {
	if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
		return *s.Spec.NodeName
	}
	return s.Spec.Pool.Name
}

// addDevice fills dev with a published device and places it on its GPU;
// false when it is not one of the driver's GPU devices.
func (b *builder) addDevice(dev *Device, part *poolPart, d *resourceapi.Device) bool {
	a := attributes{domain: b.domain, attrs: d.Attributes}
	typ := vocabulary.Kind(a.str(vocabulary.AttrType))
	minorAttr := vocabulary.AttrMinor
	switch typ {
	case vocabulary.KindGPU, vocabulary.KindTimeSlice, vocabulary.KindMPS, vocabulary.KindVFIO:
	case vocabulary.KindMIG:
		minorAttr = vocabulary.AttrParentMinor
	default:
		return false
	}
	minor, ok := a.int(minorAttr)
	if !ok {
		return false
	}
	g := part.gpus[minor]
	if g == nil {
		g = &GPU{Name: fmt.Sprintf("gpu-%d", minor), Minor: minor,
			Devices: make([]*Device, 0, 32)} // a MIG-capable GPU publishes 28
		part.gpus[minor] = g
		part.order = append(part.order, g)
	}
	g.learn(a, typ)

	*dev = Device{GPU: g, Name: d.Name, Type: typ, Taints: d.Taints}
	if c, ok := d.Capacity[resourceapi.QualifiedName(vocabulary.CapacityMemory)]; ok {
		dev.Memory = c.Value
	} else if c, ok := d.Capacity[b.domain.qualify(vocabulary.CapacityMemory)]; ok {
		dev.Memory = c.Value
	}
	switch typ {
	case vocabulary.KindMIG:
		dev.Profile = a.str(vocabulary.AttrProfile)
		dev.PlacementStart, _ = a.int(vocabulary.AttrPlacementStart)
		dev.Static = a.bool(vocabulary.AttrStatic)
		// Static MIG devices exist only on a GPU in MIG mode.
		g.MIGEnabled = g.MIGEnabled || dev.Static
	case vocabulary.KindTimeSlice, vocabulary.KindMPS:
		if c, ok := d.Capacity[resourceapi.QualifiedName(vocabulary.CapacityShares)]; ok {
			dev.Shares = c.Value.Value()
		} else if c, ok := d.Capacity[b.domain.qualify(vocabulary.CapacityShares)]; ok {
			dev.Shares = c.Value.Value()
		}
	}
	if g.Memory.IsZero() && typ != vocabulary.KindMIG {
		g.Memory = dev.Memory
	}
	// A GPU's devices consume from its own counter set only.
	for _, c := range d.ConsumesCounters {
		if g.CounterSet == "" {
			g.CounterSet = c.CounterSet
		}
		if c.CounterSet == g.CounterSet {
			dev.consumes = b.counterUses(c.Counters)
		}
	}
	for _, t := range d.Taints {
		if !slices.ContainsFunc(g.Taints, func(o resourceapi.DeviceTaint) bool {
			return o.Key == t.Key && o.Value == t.Value && o.Effect == t.Effect
		}) {
			g.Taints = append(g.Taints, t)
		}
	}
	g.Devices = append(g.Devices, dev)
	return true
}

func (b *builder) counterUses(m map[string]resourceapi.Counter) []counterUse {
	start := len(b.arena)
	for name, c := range m {
		interned, ok := b.names[name]
		if !ok {
			interned = strings.Clone(name)
			b.names[interned] = interned
		}
		b.arena = append(b.arena, counterUse{interned, c.Value.Value()})
	}
	return b.arena[start:len(b.arena):len(b.arena)]
}

// learn fills in the GPU's identity from a device. Every device of a GPU
// carries its product, versions and topology; only the whole GPU and its
// shares carry its UUID and memory, and only the whole GPU the MIG flags.
func (g *GPU) learn(a attributes, typ vocabulary.Kind) {
	set := func(field *string, name string) {
		if *field == "" {
			*field = a.str(name)
		}
	}
	set(&g.ProductName, vocabulary.AttrProductName)
	set(&g.Architecture, vocabulary.AttrArchitecture)
	set(&g.CUDAComputeCapability, vocabulary.AttrCUDAComputeCapability)
	set(&g.DriverVersion, vocabulary.AttrDriverVersion)
	set(&g.CUDADriverVersion, vocabulary.AttrCUDADriverVersion)
	set(&g.PCIBusID, vocabulary.AttrPCIBusID)
	set(&g.PCIeRoot, vocabulary.AttrPCIeRoot)
	set(&g.NVLinkDomain, vocabulary.AttrNVLinkDomain)
	if g.NUMANode == nil {
		if n, ok := a.int(vocabulary.AttrNUMANode); ok {
			g.NUMANode = &n
		}
	}
	if typ == vocabulary.KindMIG {
		set(&g.UUID, vocabulary.AttrParentUUID)
	} else {
		set(&g.UUID, vocabulary.AttrUUID)
	}
	if typ == vocabulary.KindGPU {
		g.MIGCapable = a.bool(vocabulary.AttrMIGCapable)
		g.MIGEnabled = a.bool(vocabulary.AttrMIGEnabled)
	}
}

// finish keeps the newest generation of each pool, places its GPUs on
// their nodes and adds the claims (and their pods) of src.
func (b *builder) finish(src *Source) *Inventory {
	inv := b.inv
	newest := map[string]int64{}
	for key := range b.parts {
		if g, ok := newest[key.pool]; !ok || key.generation > g {
			newest[key.pool] = key.generation
		}
	}
	index := map[deviceKey]*Device{}
	for pool, generation := range newest {
		part := b.parts[poolGeneration{pool, generation}]
		n := inv.nodes[part.node]
		if n == nil {
			n = &Node{Name: part.node}
			inv.nodes[part.node] = n
			inv.Nodes = append(inv.Nodes, n)
		}
		n.Devices += part.devices
		n.Unrecognized += part.unrecognized
		for _, g := range part.order {
			g.Node = n
			g.Counters = part.counters[g.CounterSet]
			g.MIGCapable = g.MIGCapable || slices.ContainsFunc(g.Devices, func(d *Device) bool { return d.Type == vocabulary.KindMIG })
			n.GPUs = append(n.GPUs, g)
		}
		for name, d := range part.named {
			index[deviceKey{pool, name}] = d
		}
	}
	for _, n := range inv.Nodes {
		slices.SortFunc(n.GPUs, func(a, b *GPU) int { return cmp.Compare(a.Minor, b.Minor) })
	}
	slices.SortFunc(inv.Nodes, func(a, b *Node) int { return cmp.Compare(a.Name, b.Name) })
	b.parts = nil
	inv.addClaims(src, index)
	return inv
}
