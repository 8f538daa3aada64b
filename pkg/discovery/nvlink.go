package discovery

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvlinkPeers is what one GPU's active NVLinks reach: NVSwitches and GPUs,
// both by PCI bus ID.
type nvlinkPeers struct {
	switches []string
	gpus     []string
}

// fabricClique returns the NVLink cluster UUID and clique NVML's GPU fabric
// reports (Hopper and later with NVSwitch fabric manager; on multi-node
// NVLink racks such as GB200 NVL72 every tray of a rack reports the same
// cluster UUID, and the trays of one NVLink partition the same clique). Both
// are empty when the fabric is not supported or not ready. The clique is
// "<cluster UUID>.<clique ID>", as NVIDIA's ComputeDomain status writes it.
func fabricClique(dev nvml.Device) (cluster, clique string) {
	info, ret := dev.GetGpuFabricInfo()
	if ret != nvml.SUCCESS || info.State != nvml.GPU_FABRIC_STATE_COMPLETED || nvml.Return(info.Status) != nvml.SUCCESS {
		return "", ""
	}
	var zero [16]uint8
	if info.ClusterUuid == zero {
		return "", ""
	}
	u := hex.EncodeToString(info.ClusterUuid[:])
	cluster = fmt.Sprintf("%s-%s-%s-%s-%s", u[0:8], u[8:12], u[12:16], u[16:20], u[20:])
	return cluster, fmt.Sprintf("%s.%d", cluster, info.CliqueId)
}

// activeNVLinkPeers walks the GPU's links; a GPU without NVLink answers
// NOT_SUPPORTED on the first link.
func activeNVLinkPeers(dev nvml.Device) nvlinkPeers {
	var peers nvlinkPeers
	for link := range nvml.NVLINK_MAX_LINKS {
		state, ret := dev.GetNvLinkState(link)
		if ret != nvml.SUCCESS {
			if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
				break
			}
			continue
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		pci, ret := dev.GetNvLinkRemotePciInfo(link)
		if ret != nvml.SUCCESS {
			continue
		}
		remote := normalizePCIBusID(int8String(pci.BusId[:]))
		kind, ret := dev.GetNvLinkRemoteDeviceType(link)
		switch {
		case ret == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_SWITCH:
			peers.switches = append(peers.switches, remote)
		case ret == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_GPU:
			peers.gpus = append(peers.gpus, remote)
		}
	}
	return peers
}

// assignNVLinkDomains gives GPUs without a fabric domain one derived from
// NVLink connectivity: GPUs joined directly or through a common NVSwitch form
// one domain, named after its members so the name is stable across restarts.
func assignNVLinkDomains(gpus []GPU, links []nvlinkPeers) {
	parent := make([]int, len(gpus))
	for i := range parent {
		parent[i] = i
	}
	var find func(int) int
	find = func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	union := func(a, b int) { parent[find(a)] = find(b) }

	byBus := map[string]int{}
	for i := range gpus {
		byBus[gpus[i].PCIBusID] = i
	}
	bySwitch := map[string]int{}
	linked := make([]bool, len(gpus))
	for i, peers := range links {
		for _, sw := range peers.switches {
			linked[i] = true
			if j, ok := bySwitch[sw]; ok {
				union(i, j)
			} else {
				bySwitch[sw] = i
			}
		}
		for _, bus := range peers.gpus {
			if j, ok := byBus[bus]; ok {
				linked[i], linked[j] = true, true
				union(i, j)
			}
		}
	}

	members := map[int][]string{}
	for i := range gpus {
		if linked[i] && gpus[i].NVLinkDomain == "" {
			root := find(i)
			members[root] = append(members[root], gpus[i].UUID)
		}
	}
	for i := range gpus {
		if !linked[i] || gpus[i].NVLinkDomain != "" {
			continue
		}
		uuids := members[find(i)]
		if len(uuids) < 2 {
			continue // a link to nothing we know is no domain
		}
		sort.Strings(uuids)
		sum := sha256.Sum256([]byte(strings.Join(uuids, ",")))
		gpus[i].NVLinkDomain = "nvlink-" + hex.EncodeToString(sum[:6])
	}
}
