package kubectlgpu

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// addClaims adds the claims that hold devices of the driver, or are pending
// with a request for one of its classes, and links their allocation
// results to the devices (found in devices) and their pods.
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
		requestsOurs := false
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
				requestsOurs = requestsOurs || driverClasses(class)
			}
		}
		if alloc := rc.Status.Allocation; alloc != nil {
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
				var devType vocabulary.Kind
				if h.Device != nil {
					devType = h.Device.Type
					h.Device.Holdings = append(h.Device.Holdings, h)
				}
				h.Config = configs.effectiveConfig(alloc.Devices.Config, inv.Driver, r.Request, devType)
				c.Holdings = append(c.Holdings, h)
			}
		}
		// An allocated claim is ours when it holds our devices, a pending
		// one when it asks for them.
		if len(c.Holdings) == 0 && (c.Allocated || !requestsOurs) {
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

// claimNode is where a claim's devices are: its reserved pods' node, else
// the node of its devices, of its allocation's node selector, or its pool.
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
	if len(c.Holdings) > 0 {
		return c.Holdings[0].Pool
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

// forClaim lists the pods a claim is reserved for, then the pods that
// reference it without being reserved.
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
