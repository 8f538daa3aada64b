package kubectlgpu

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Report kinds, in the kind field of -o json|yaml.
const (
	KindNodeList  = "GPUNodeList"
	KindNode      = "GPUNode"
	KindClaimList = "GPUClaimList"
)

// NodeList is the report of `kubectl gpu nodes`.
type NodeList struct {
	Kind   string        `json:"kind"`
	Driver string        `json:"driver"`
	Nodes  []NodeSummary `json:"nodes"`
	Total  Total         `json:"total"`
}

// NodeSummary is one node's GPUs and how each is used.
type NodeSummary struct {
	Name string `json:"name"`
	// Models count the GPUs by product name, in order of first minor.
	Models []ModelCount `json:"models"`
	// Memory is the GPUs' memory, summed.
	Memory resource.Quantity `json:"memory"`
	// GPUCount, MIGCapable, Free and Tainted count GPUs.
	GPUCount   int `json:"gpuCount"`
	MIGCapable int `json:"migCapable"`
	Free       int `json:"free"`
	Tainted    int `json:"tainted"`
	// DriverVersion and CUDADriverVersion are those of the first GPU.
	DriverVersion     string `json:"driverVersion,omitempty"`
	CUDADriverVersion string `json:"cudaDriverVersion,omitempty"`
	// Devices counts the published devices, Claims the claims holding any.
	Devices int         `json:"devices"`
	Claims  int         `json:"claims"`
	GPUs    []GPUStatus `json:"gpus"`
}

// ModelCount is a number of GPUs of one product.
type ModelCount struct {
	ProductName string `json:"productName"`
	Count       int    `json:"count"`
}

// GPUStatus is one GPU and how it is used now.
type GPUStatus struct {
	Name        string            `json:"name"`
	Minor       int64             `json:"minor"`
	UUID        string            `json:"uuid,omitempty"`
	ProductName string            `json:"productName,omitempty"`
	Memory      resource.Quantity `json:"memory"`
	MIGCapable  bool              `json:"migCapable"`
	Usage       Usage             `json:"usage"`
	Taints      []Taint           `json:"taints,omitempty"`
}

// Taint is a device taint of the GPU or one of its devices.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

func (t Taint) String() string {
	if t.Value == "" {
		return t.Key + ":" + t.Effect
	}
	return t.Key + "=" + t.Value + ":" + t.Effect
}

// Total sums the nodes of a NodeList.
type Total struct {
	Nodes      int               `json:"nodes"`
	GPUs       int               `json:"gpus"`
	Models     []ModelCount      `json:"models"`
	Memory     resource.Quantity `json:"memory"`
	MIGCapable int               `json:"migCapable"`
	Free       int               `json:"free"`
	Tainted    int               `json:"tainted"`
	// Whole, MIG, TimeSlicing, MPS and Passthrough count GPUs in each
	// state.
	Whole       int `json:"whole"`
	MIG         int `json:"mig"`
	TimeSlicing int `json:"timeSlicing"`
	MPS         int `json:"mps"`
	Passthrough int `json:"passthrough"`
	// MIGDevices and Shares count allocated MIG devices and shares.
	MIGDevices int   `json:"migDevices"`
	Shares     int64 `json:"shares"`
}

// NodeDetail is the report of `kubectl gpu node NAME`.
type NodeDetail struct {
	Kind    string      `json:"kind"`
	Driver  string      `json:"driver"`
	Name    string      `json:"name"`
	Devices int         `json:"devices"`
	GPUs    []GPUDetail `json:"gpus"`
}

// GPUDetail is one GPU with its devices, holders and free MIG placements.
type GPUDetail struct {
	GPUStatus
	Architecture          string `json:"architecture,omitempty"`
	CUDAComputeCapability string `json:"cudaComputeCapability,omitempty"`
	DriverVersion         string `json:"driverVersion,omitempty"`
	CUDADriverVersion     string `json:"cudaDriverVersion,omitempty"`
	PCIBusID              string `json:"pciBusID,omitempty"`
	PCIeRoot              string `json:"pcieRoot,omitempty"`
	NUMANode              *int64 `json:"numaNode,omitempty"`
	NVLinkDomain          string `json:"nvlinkDomain,omitempty"`
	MIGEnabled            bool   `json:"migEnabled"`
	// Devices are in publication order.
	Devices []DeviceInfo `json:"devices"`
	// Holders are the allocations of the GPU's devices.
	Holders []Holder `json:"holders,omitempty"`
	// FreeMIG are the free MIG placements by profile.
	FreeMIG []FreeMIG `json:"freeMIG,omitempty"`
}

// DeviceInfo is one published device.
type DeviceInfo struct {
	Name           string          `json:"name"`
	Type           vocabulary.Kind `json:"type"`
	Profile        string          `json:"profile,omitempty"`
	PlacementStart *int64          `json:"placementStart,omitempty"`
	Static         bool            `json:"static,omitempty"`
	Allocations    int             `json:"allocations"`
	Taints         []Taint         `json:"taints,omitempty"`
	// Unavailable says why the device cannot be allocated now (its GPU is
	// passed through); absent when nothing known rules it out.
	Unavailable *Unavailable `json:"unavailable,omitempty"`
}

// Allocation is one allocation result of the driver in a claim.
type Allocation struct {
	Request string `json:"request"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	// Type, GPU and Profile are empty when no current slice publishes the
	// device.
	Type    vocabulary.Kind `json:"type,omitempty"`
	GPU     string          `json:"gpu,omitempty"`
	Profile string          `json:"profile,omitempty"`
	ShareID string          `json:"shareID,omitempty"`
	// Consumed is the capacity a share consumes.
	Consumed    map[string]resource.Quantity `json:"consumed,omitempty"`
	AdminAccess bool                         `json:"adminAccess,omitempty"`
	Config      Config                       `json:"config"`
}

// Holder is a claim holding a device of a GPU.
type Holder struct {
	Namespace string   `json:"namespace"`
	Claim     string   `json:"claim"`
	Pods      []PodRef `json:"pods,omitempty"`
	Allocation
}

// ClaimList is the report of `kubectl gpu claims`.
type ClaimList struct {
	Kind   string `json:"kind"`
	Driver string `json:"driver"`
	// Namespace is empty for all namespaces.
	Namespace string        `json:"namespace,omitempty"`
	Claims    []ClaimStatus `json:"claims"`
}

// ClaimStatus is a claim, its pods, node and devices.
type ClaimStatus struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// State is as kubectl get resourceclaims shows it: pending or
	// allocated, then ",reserved" and ",deleted" when they apply.
	State   string       `json:"state"`
	Classes []string     `json:"classes,omitempty"`
	Node    string       `json:"node,omitempty"`
	Pods    []PodRef     `json:"pods,omitempty"`
	Devices []Allocation `json:"devices,omitempty"`
}

// NodeList reports every node.
func (inv *Inventory) NodeList() NodeList {
	out := NodeList{Kind: KindNodeList, Driver: inv.Driver, Nodes: []NodeSummary{}}
	total := &out.Total
	total.Memory = *resource.NewQuantity(0, resource.BinarySI)
	for _, n := range inv.Nodes {
		s := n.summary()
		out.Nodes = append(out.Nodes, s)
		total.Nodes++
		total.GPUs += s.GPUCount
		total.Memory.Add(s.Memory)
		total.MIGCapable += s.MIGCapable
		total.Free += s.Free
		total.Tainted += s.Tainted
		for _, m := range s.Models {
			total.Models = addModel(total.Models, m.ProductName, m.Count)
		}
		for _, g := range s.GPUs {
			switch g.Usage.State {
			case StateWhole:
				total.Whole++
			case StateMIG:
				total.MIG++
			case StateTimeSlicing:
				total.TimeSlicing++
			case StateMPS:
				total.MPS++
			case StatePassthrough:
				total.Passthrough++
			}
			for _, p := range g.Usage.MIG {
				total.MIGDevices += p.Count
			}
			for _, sh := range g.Usage.Shares {
				total.Shares += sh.Used
			}
		}
	}
	return out
}

func addModel(models []ModelCount, product string, n int) []ModelCount {
	if product == "" {
		product = "unknown"
	}
	i := slices.IndexFunc(models, func(m ModelCount) bool { return m.ProductName == product })
	if i < 0 {
		return append(models, ModelCount{ProductName: product, Count: n})
	}
	models[i].Count += n
	return models
}

func (n *Node) summary() NodeSummary {
	s := NodeSummary{Name: n.Name, GPUCount: len(n.GPUs), Devices: n.Devices, GPUs: []GPUStatus{},
		Memory: *resource.NewQuantity(0, resource.BinarySI)}
	claims := map[string]bool{}
	for _, g := range n.GPUs {
		st := g.status()
		s.GPUs = append(s.GPUs, st)
		s.Models = addModel(s.Models, g.ProductName, 1)
		s.Memory.Add(g.Memory)
		if g.MIGCapable {
			s.MIGCapable++
		}
		if st.Usage.State == StateFree {
			s.Free++
		}
		if len(st.Taints) > 0 {
			s.Tainted++
		}
		if s.DriverVersion == "" {
			s.DriverVersion, s.CUDADriverVersion = g.DriverVersion, g.CUDADriverVersion
		}
		for _, c := range st.Usage.Claims {
			claims[c] = true
		}
	}
	s.Claims = len(claims)
	return s
}

func (g *GPU) status() GPUStatus {
	st := GPUStatus{Name: g.Name, Minor: g.Minor, UUID: g.UUID, ProductName: g.ProductName,
		Memory: g.Memory, MIGCapable: g.MIGCapable, Usage: g.Usage()}
	for _, t := range g.Taints {
		st.Taints = append(st.Taints, Taint{Key: t.Key, Value: t.Value, Effect: string(t.Effect)})
	}
	return st
}

// NodeDetail reports one node; it fails when the node publishes no
// devices of the driver.
func (inv *Inventory) NodeDetail(name string) (NodeDetail, error) {
	n := inv.nodes[name]
	if n == nil {
		return NodeDetail{}, fmt.Errorf("node %q publishes no GPUs of the %s driver (no ResourceSlices with spec.nodeName=%s); `kubectl gpu nodes` lists the nodes that do",
			name, inv.Driver, name)
	}
	out := NodeDetail{Kind: KindNode, Driver: inv.Driver, Name: n.Name, Devices: n.Devices, GPUs: []GPUDetail{}}
	for _, g := range n.GPUs {
		d := GPUDetail{
			GPUStatus: g.status(), Architecture: g.Architecture, CUDAComputeCapability: g.CUDAComputeCapability,
			DriverVersion: g.DriverVersion, CUDADriverVersion: g.CUDADriverVersion,
			PCIBusID: g.PCIBusID, PCIeRoot: g.PCIeRoot, NUMANode: g.NUMANode, NVLinkDomain: g.NVLinkDomain,
			MIGEnabled: g.MIGEnabled, FreeMIG: g.FreeMIG(),
		}
		for _, dev := range g.Devices {
			info := DeviceInfo{Name: dev.Name, Type: dev.Type, Profile: dev.Profile, Static: dev.Static, Allocations: len(dev.Holdings),
				Unavailable: dev.unavailable(d.Usage)}
			if dev.Type == vocabulary.KindMIG {
				info.PlacementStart = &dev.PlacementStart
			}
			for _, t := range dev.Taints {
				info.Taints = append(info.Taints, Taint{Key: t.Key, Value: t.Value, Effect: string(t.Effect)})
			}
			d.Devices = append(d.Devices, info)
			for _, h := range dev.Holdings {
				d.Holders = append(d.Holders, Holder{Namespace: h.Claim.Namespace, Claim: h.Claim.Name,
					Pods: h.Claim.Pods, Allocation: h.allocation()})
			}
		}
		out.GPUs = append(out.GPUs, d)
	}
	return out, nil
}

func (h *Holding) allocation() Allocation {
	a := Allocation{Request: h.Request, Pool: h.Pool, Device: h.DeviceName, ShareID: h.ShareID,
		Consumed: h.Consumed, AdminAccess: h.AdminAccess, Config: h.Config}
	if d := h.Device; d != nil {
		a.Type, a.GPU, a.Profile = d.Type, d.GPU.Name, d.Profile
	}
	return a
}

// ClaimList reports the claims; namespace is what was listed ("" for all).
func (inv *Inventory) ClaimList(namespace string) ClaimList {
	out := ClaimList{Kind: KindClaimList, Driver: inv.Driver, Namespace: namespace, Claims: []ClaimStatus{}}
	for _, c := range inv.Claims {
		if namespace != "" && c.Namespace != namespace {
			continue
		}
		st := ClaimStatus{Namespace: c.Namespace, Name: c.Name, Classes: c.Classes, Node: c.Node, Pods: c.Pods}
		states := []string{"pending"}
		if c.Allocated {
			states[0] = "allocated"
		}
		if slices.ContainsFunc(c.Pods, func(p PodRef) bool { return p.Reserved }) {
			states = append(states, "reserved")
		}
		if c.Deleting {
			states = append(states, "deleted")
		}
		st.State = strings.Join(states, ",")
		for _, h := range c.Holdings {
			st.Devices = append(st.Devices, h.allocation())
		}
		out.Claims = append(out.Claims, st)
	}
	return out
}
