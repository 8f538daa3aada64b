// Package discovery reads a node's NVIDIA GPUs through NVML into plain data.
//
// It is the only place that asks NVML about device identity and topology; the
// device model, CDI and health code work on the GPU values it returns. The
// same code runs over the real libnvidia-ml and over pkg/nvmlsim.
package discovery

import (
	"fmt"
	"strings"

	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
)

// GPU describes one physical GPU as NVML reports it.
type GPU struct {
	// Index is NVML's enumeration index; it can change across reboots.
	Index int
	// Minor is the /dev/nvidia<minor> number; stable for a given PCI slot.
	Minor int
	UUID  string
	// ProductName is NVML's device name, e.g. "NVIDIA H100 80GB HBM3".
	ProductName  string
	Brand        string
	Architecture string
	// CUDAComputeCapability as "major.minor", e.g. "9.0".
	CUDAComputeCapability string
	DriverVersion         string
	// CUDADriverVersion as "major.minor", e.g. "12.4".
	CUDADriverVersion string
	MemoryBytes       uint64
	// Multiprocessors is 0 when NVML does not report it.
	Multiprocessors int
	// PCIBusID in the kernel's extended BDF form, e.g. "0000:18:00.0".
	PCIBusID string
	// PCIeRoot is "pci<domain>:<bus>", empty when sysfs does not resolve it.
	PCIeRoot string
	// NUMANode is -1 when the device has no NUMA affinity or it is unknown.
	NUMANode   int
	MIGCapable bool
	// MIGEnabled is the current MIG mode; MIGPendingEnabled is the mode after
	// the next GPU reset, which differs while a mode change waits for a reset.
	MIGEnabled        bool
	MIGPendingEnabled bool
	// NVLinkDomain names the set of GPUs this GPU reaches over NVLink or
	// NVSwitch; empty when the GPU has no active NVLink.
	NVLinkDomain string
	// ClusterUUID and CliqueID are the NVLink fabric's cluster UUID and
	// clique ("<cluster UUID>.<clique ID>") as NVML's GPU fabric info
	// reports them; empty without a completed fabric. GPUs of several nodes
	// with one CliqueID share multi-node NVLink (an IMEX domain can span
	// them).
	ClusterUUID string
	CliqueID    string
	// MIG is the GPU's MIG geometry (profiles, placements, totals) and its
	// existing instances; nil when the GPU is not MIG capable.
	MIG *mig.Info
}

// CanonicalName is the stable device name published for the whole GPU. The
// minor number follows the PCI slot, so the name survives plugin restarts
// and reboots, unlike NVML's index.
func (g *GPU) CanonicalName() string {
	return fmt.Sprintf("gpu-%d", g.Minor)
}

// DeviceNode is the GPU's character device path inside a container.
func (g *GPU) DeviceNode() string {
	return fmt.Sprintf("/dev/nvidia%d", g.Minor)
}

// normalizePCIBusID turns NVML's "00000000:18:00.0" (8-digit domain) into
// the kernel's "0000:18:00.0", lower-cased.
func normalizePCIBusID(id string) string {
	id = strings.ToLower(strings.TrimRight(id, "\x00"))
	domain, rest, ok := strings.Cut(id, ":")
	if !ok {
		return id
	}
	if len(domain) > 4 {
		domain = domain[len(domain)-4:]
	}
	return domain + ":" + rest
}
