package kubectlgpu

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
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
	domain *domain
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

	gpus   map[int64]*GPU
	domain *domain
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

	// Devices are in publication order.
	Devices []*Device
	// Taints are those of any of its devices, each once.
	Taints []resourceapi.DeviceTaint
}

// Device is one published device of a GPU.
type Device struct {
	GPU *GPU
	// Name is the device name, unique in its pool.
	Name string
	// Type is TypeGPU, TypeMIG, TypeTimeSlicing or TypeMPS.
	Type string
	// Profile and PlacementStart describe a MIG device; Static marks one
	// created out of band.
	Profile        string
	PlacementStart int64
	Static         bool
	Taints         []resourceapi.DeviceTaint
	// Holdings are the allocation results naming the device.
	Holdings []*Holding

	// api is the published device; it is read, never written.
	api *resourceapi.Device
	// consumes is what the device takes from its GPU's counter set, nil
	// when it uses no counters (a static MIG device).
	consumes map[string]resourceapi.Counter
}

// Capacity returns one of the device's capacities by its name in the
// driver's domain ("memory" also finds "gpu.dra.dev/memory").
func (d *Device) Capacity(name string) (resource.Quantity, bool) {
	if c, ok := d.api.Capacity[resourceapi.QualifiedName(name)]; ok {
		return c.Value, true
	}
	c, ok := d.api.Capacity[d.GPU.Node.domain.qualify(name)]
	return c.Value, ok
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

// Build indexes src into an Inventory for driver. Only the newest
// generation of each pool counts, as for the scheduler.
func Build(driver string, src *Source) *Inventory {
	inv := &Inventory{Driver: driver, nodes: map[string]*Node{}, domain: newDomain(driver)}
	// Only allocated devices need finding by name; indexing just those
	// keeps the index as small as the claims.
	allocated := map[deviceKey]*Device{}
	for i := range src.Claims {
		if alloc := src.Claims[i].Status.Allocation; alloc != nil {
			for _, r := range alloc.Devices.Results {
				if r.Driver == driver {
					allocated[deviceKey{r.Pool, r.Device}] = nil
				}
			}
		}
	}
	inv.addSlices(src.Slices, allocated)
	inv.addClaims(src, allocated)
	return inv
}

type deviceKey struct{ pool, device string }

type counterKey struct{ pool, set string }

// addSlices adds the devices of the current slices, and fills in the
// allocated ones in index.
func (inv *Inventory) addSlices(all []resourceapi.ResourceSlice, index map[deviceKey]*Device) {
	generation := map[string]int64{}
	for i := range all {
		s := &all[i]
		if s.Spec.Driver == inv.Driver {
			generation[s.Spec.Pool.Name] = max(generation[s.Spec.Pool.Name], s.Spec.Pool.Generation)
		}
	}
	current := func(s *resourceapi.ResourceSlice) bool {
		return s.Spec.Driver == inv.Driver && s.Spec.Pool.Generation == generation[s.Spec.Pool.Name]
	}
	counters := map[counterKey]map[string]resourceapi.Counter{}
	for i := range all {
		s := &all[i]
		if !current(s) {
			continue
		}
		for _, cs := range s.Spec.SharedCounters {
			counters[counterKey{s.Spec.Pool.Name, cs.Name}] = cs.Counters
		}
	}

	for i := range all {
		s := &all[i]
		if !current(s) {
			continue
		}
		node := inv.node(sliceNode(s))
		devs := make([]Device, len(s.Spec.Devices)) // one allocation per slice
		for j := range s.Spec.Devices {
			d := &s.Spec.Devices[j]
			node.Devices++
			if !inv.addDevice(&devs[j], node, s.Spec.Pool.Name, d, counters) {
				node.Unrecognized++
				continue
			}
			key := deviceKey{s.Spec.Pool.Name, d.Name}
			if _, ok := index[key]; ok {
				index[key] = &devs[j]
			}
		}
	}
	for _, n := range inv.Nodes {
		slices.SortFunc(n.GPUs, func(a, b *GPU) int { return cmp.Compare(a.Minor, b.Minor) })
		for _, g := range n.GPUs {
			g.MIGCapable = g.MIGCapable || slices.ContainsFunc(g.Devices, func(d *Device) bool { return d.Type == TypeMIG })
		}
	}
	slices.SortFunc(inv.Nodes, func(a, b *Node) int { return cmp.Compare(a.Name, b.Name) })
}

// sliceNode is the node a slice's pool belongs to: the driver publishes one
// pool per node, named after it.
func sliceNode(s *resourceapi.ResourceSlice) string {
	if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
		return *s.Spec.NodeName
	}
	return s.Spec.Pool.Name
}

func (inv *Inventory) node(name string) *Node {
	n := inv.nodes[name]
	if n == nil {
		n = &Node{Name: name, gpus: map[int64]*GPU{}, domain: inv.domain}
		inv.nodes[name] = n
		inv.Nodes = append(inv.Nodes, n)
	}
	return n
}

// addDevice fills dev with a published device and places it on its GPU;
// false when it is not one of the driver's GPU devices.
func (inv *Inventory) addDevice(dev *Device, node *Node, pool string, d *resourceapi.Device, counters map[counterKey]map[string]resourceapi.Counter) bool {
	a := attributes{domain: inv.domain, attrs: d.Attributes}
	typ := a.str(attrType)
	minorAttr := attrMinor
	switch typ {
	case TypeGPU, TypeTimeSlicing, TypeMPS:
	case TypeMIG:
		minorAttr = attrParentMinor
	default:
		return false
	}
	minor, ok := a.int(minorAttr)
	if !ok {
		return false
	}
	g := node.gpus[minor]
	if g == nil {
		g = &GPU{Node: node, Name: fmt.Sprintf("gpu-%d", minor), Minor: minor,
			Devices: make([]*Device, 0, 32)} // a MIG-capable GPU publishes 28

		node.gpus[minor] = g
		node.GPUs = append(node.GPUs, g)
	}
	g.learn(a, typ)

	*dev = Device{GPU: g, Name: d.Name, Type: typ, Taints: d.Taints, api: d}
	if typ == TypeMIG {
		dev.Profile = a.str(attrProfile)
		dev.PlacementStart, _ = a.int(attrPlacementStart)
		dev.Static = a.bool(attrStatic)
		// Static MIG devices exist only on a GPU in MIG mode.
		g.MIGEnabled = g.MIGEnabled || dev.Static
	}
	// A GPU's devices consume from its own counter set only.
	for _, c := range d.ConsumesCounters {
		if g.CounterSet == "" {
			g.CounterSet = c.CounterSet
			g.Counters = counters[counterKey{pool, c.CounterSet}]
		}
		if c.CounterSet == g.CounterSet {
			dev.consumes = c.Counters
		}
	}
	for _, t := range d.Taints {
		if !slices.ContainsFunc(g.Taints, func(o resourceapi.DeviceTaint) bool {
			return o.Key == t.Key && o.Value == t.Value && o.Effect == t.Effect
		}) {
			g.Taints = append(g.Taints, t)
		}
	}
	if g.Memory.IsZero() && typ != TypeMIG {
		g.Memory, _ = dev.Capacity(capMemory)
	}
	g.Devices = append(g.Devices, dev)
	return true
}

// learn fills in the GPU's identity from a device. Every device of a GPU
// carries its product, versions and topology; only the whole GPU and its
// shares carry its UUID and memory, and only the whole GPU the MIG flags.
func (g *GPU) learn(a attributes, typ string) {
	set := func(field *string, name string) {
		if *field == "" {
			*field = a.str(name)
		}
	}
	set(&g.ProductName, attrProductName)
	set(&g.Architecture, attrArchitecture)
	set(&g.CUDAComputeCapability, attrCUDAComputeCapability)
	set(&g.DriverVersion, attrDriverVersion)
	set(&g.CUDADriverVersion, attrCUDADriverVersion)
	set(&g.PCIBusID, attrPCIBusID)
	set(&g.PCIeRoot, attrPCIeRoot)
	set(&g.NVLinkDomain, attrNVLinkDomain)
	if g.NUMANode == nil {
		if n, ok := a.int(attrNUMANode); ok {
			g.NUMANode = &n
		}
	}
	switch typ {
	case TypeMIG:
		set(&g.UUID, attrParentUUID)
	default:
		set(&g.UUID, attrUUID)
	}
	if typ == TypeGPU {
		g.MIGCapable = a.bool(attrMIGCapable)
		g.MIGEnabled = a.bool(attrMIGEnabled)
	}
}

func (inv *Inventory) addClaims(src *Source, devices map[deviceKey]*Device) {
	driverClasses := inv.driverClasses(src.Classes)
	pods := indexPods(src.Pods)
	configs := configCache{}
	for i := range src.Claims {
		rc := &src.Claims[i]
		c := &Claim{
			Namespace: rc.Namespace, Name: rc.Name, UID: rc.UID,
			Allocated: rc.Status.Allocation != nil,
			Deleting:  rc.DeletionTimestamp != nil,
		}
		ours := false
		for _, r := range rc.Spec.Devices.Requests {
			classes := []string{}
			if r.Exactly != nil {
				classes = append(classes, r.Exactly.DeviceClassName)
			}
			for _, sub := range r.FirstAvailable {
				classes = append(classes, sub.DeviceClassName)
			}
			for _, class := range classes {
				if !slices.Contains(c.Classes, class) {
					c.Classes = append(c.Classes, class)
				}
				ours = ours || driverClasses(class)
			}
		}
		if alloc := rc.Status.Allocation; alloc != nil {
			ours = false // allocated: it is ours if it holds our devices
			for _, r := range alloc.Devices.Results {
				if r.Driver != inv.Driver {
					continue
				}
				h := &Holding{
					Claim: c, Request: r.Request, Pool: r.Pool, DeviceName: r.Device,
					Device:      devices[deviceKey{r.Pool, r.Device}],
					Consumed:    unqualify(inv.Driver, r.ConsumedCapacity),
					AdminAccess: r.AdminAccess != nil && *r.AdminAccess,
				}
				if r.ShareID != nil {
					h.ShareID = string(*r.ShareID)
				}
				devType := ""
				if h.Device != nil {
					devType = h.Device.Type
					h.Device.Holdings = append(h.Device.Holdings, h)
				}
				h.Config = configs.effectiveConfig(alloc.Devices.Config, inv.Driver, r.Request, devType)
				c.Holdings = append(c.Holdings, h)
			}
			ours = len(c.Holdings) > 0
		}
		if !ours {
			continue
		}
		c.Pods = pods.forClaim(rc)
		c.Node = inv.claimNode(c, rc)
		inv.Claims = append(inv.Claims, c)
	}
	slices.SortFunc(inv.Claims, func(a, b *Claim) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
}

// driverClasses reports whether a DeviceClass selects devices of the
// driver: its name is the driver's or ends in ".<driver>" (the classes this
// project ships), its CEL names the driver, or it carries config for it.
func (inv *Inventory) driverClasses(classes []resourceapi.DeviceClass) func(string) bool {
	known := map[string]bool{}
	quoted := fmt.Sprintf("%q", inv.Driver)
	for i := range classes {
		dc := &classes[i]
		for _, s := range dc.Spec.Selectors {
			if s.CEL != nil && strings.Contains(s.CEL.Expression, quoted) {
				known[dc.Name] = true
			}
		}
		for _, c := range dc.Spec.Config {
			if c.Opaque != nil && c.Opaque.Driver == inv.Driver {
				known[dc.Name] = true
			}
		}
	}
	suffix := "." + inv.Driver
	return func(name string) bool {
		return known[name] || name == inv.Driver || strings.HasSuffix(name, suffix)
	}
}

func (inv *Inventory) claimNode(c *Claim, rc *resourceapi.ResourceClaim) string {
	for _, p := range c.Pods {
		if p.Reserved && p.Node != "" {
			return p.Node
		}
	}
	for _, h := range c.Holdings {
		if h.Device != nil {
			return h.Device.GPU.Node.Name
		}
	}
	if alloc := rc.Status.Allocation; alloc != nil && alloc.NodeSelector != nil {
		for _, term := range alloc.NodeSelector.NodeSelectorTerms {
			for _, f := range term.MatchFields {
				if f.Key == "metadata.name" && len(f.Values) == 1 {
					return f.Values[0]
				}
			}
		}
	}
	for _, h := range c.Holdings {
		return h.Pool
	}
	return ""
}

// podIndex finds pods by namespace/name and by the claims they reference.
type podIndex struct {
	byName  map[string]*corev1.Pod
	byClaim map[string][]*corev1.Pod
}

func indexPods(pods []corev1.Pod) podIndex {
	idx := podIndex{byName: make(map[string]*corev1.Pod, len(pods)), byClaim: map[string][]*corev1.Pod{}}
	for i := range pods {
		p := &pods[i]
		idx.byName[p.Namespace+"/"+p.Name] = p
		var names []string
		for _, rc := range p.Spec.ResourceClaims {
			if rc.ResourceClaimName != nil {
				names = append(names, *rc.ResourceClaimName)
			}
		}
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.ResourceClaimName != nil {
				names = append(names, *st.ResourceClaimName)
			}
		}
		for _, n := range names {
			key := p.Namespace + "/" + n
			if !slices.Contains(idx.byClaim[key], p) {
				idx.byClaim[key] = append(idx.byClaim[key], p)
			}
		}
	}
	return idx
}

func (idx podIndex) forClaim(rc *resourceapi.ResourceClaim) []PodRef {
	var out []PodRef
	seen := map[string]bool{}
	for _, ref := range rc.Status.ReservedFor {
		if ref.APIGroup != "" || ref.Resource != "pods" {
			continue
		}
		pr := PodRef{Name: ref.Name, Reserved: true}
		if p := idx.byName[rc.Namespace+"/"+ref.Name]; p != nil && p.UID == ref.UID {
			pr.Phase, pr.Node = string(p.Status.Phase), p.Spec.NodeName
		}
		seen[ref.Name] = true
		out = append(out, pr)
	}
	for _, p := range idx.byClaim[rc.Namespace+"/"+rc.Name] {
		if !seen[p.Name] {
			seen[p.Name] = true
			out = append(out, PodRef{Name: p.Name, Phase: string(p.Status.Phase), Node: p.Spec.NodeName})
		}
	}
	return out
}
