// Package dcgm holds the metric and label names of NVIDIA dcgm-exporter that
// the kubelet plugin's opt-in dcgm-compatible exposition uses
// (--dcgm-metrics; docs/telemetry.md), so that dashboards and alerts written
// for dcgm-exporter keep working under DRA. The names are dcgm-exporter's:
// its etc/default-counters.csv and etc/dcp-metrics-included.csv for the
// metrics, internal/pkg/transformation for the pod and DRA labels. It holds
// names only, so tests and tools can use them without linking NVML.
package dcgm

// Metric names, with dcgm-exporter's units.
const (
	// GPUUtil is the GPU's utilization in percent (0–100).
	GPUUtil = "DCGM_FI_DEV_GPU_UTIL"
	// MemCopyUtil is the memory utilization in percent (0–100).
	MemCopyUtil = "DCGM_FI_DEV_MEM_COPY_UTIL"
	// FBUsed is the framebuffer memory used, in MiB.
	FBUsed = "DCGM_FI_DEV_FB_USED"
	// FBFree is the framebuffer memory free, in MiB.
	FBFree = "DCGM_FI_DEV_FB_FREE"
	// GPUTemp is the GPU temperature in °C.
	GPUTemp = "DCGM_FI_DEV_GPU_TEMP"
	// PowerUsage is the power draw in W.
	PowerUsage = "DCGM_FI_DEV_POWER_USAGE"
	// TotalEnergy is the energy consumed, in mJ (a counter).
	TotalEnergy = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
	// SMClock is the SM clock in MHz.
	SMClock = "DCGM_FI_DEV_SM_CLOCK"
	// MemClock is the memory clock in MHz.
	MemClock = "DCGM_FI_DEV_MEM_CLOCK"
	// XIDErrors is the value of the last XID error seen (0: none).
	XIDErrors = "DCGM_FI_DEV_XID_ERRORS"
	// GREngineActive is the ratio (0–1) of time the graphics engine was
	// active; on MIG devices, the GPU instance's.
	GREngineActive = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
	// NVLinkTxBytes and NVLinkRxBytes are the NVLink data rates in bytes
	// per second, without protocol headers.
	NVLinkTxBytes = "DCGM_FI_PROF_NVLINK_TX_BYTES"
	NVLinkRxBytes = "DCGM_FI_PROF_NVLINK_RX_BYTES"
)

// Metrics lists every metric name above.
var Metrics = []string{GPUUtil, MemCopyUtil, FBUsed, FBFree, GPUTemp, PowerUsage, TotalEnergy,
	SMClock, MemClock, XIDErrors, GREngineActive, NVLinkTxBytes, NVLinkRxBytes}

// Label names.
const (
	// LabelGPU is the GPU's index ("0").
	LabelGPU = "gpu"
	// LabelUUID is the GPU's UUID; on MIG devices the parent GPU's, as in
	// dcgm-exporter (GPU_I_ID tells the instances apart).
	LabelUUID = "UUID"
	// LabelPCIBusID is the GPU's PCI address.
	LabelPCIBusID = "pci_bus_id"
	// LabelDevice is the GPU's device file name ("nvidia0").
	LabelDevice = "device"
	// LabelModelName is the GPU's product name.
	LabelModelName = "modelName"
	// LabelHostname is the node's name.
	LabelHostname = "Hostname"
	// LabelGPUInstanceProfile and LabelGPUInstanceID name a MIG device's
	// GPU instance ("1g.10gb", "13"); empty on GPUs.
	LabelGPUInstanceProfile = "GPU_I_PROFILE"
	LabelGPUInstanceID      = "GPU_I_ID"
	// LabelNamespace, LabelPod and LabelContainer name the holder.
	LabelNamespace = "namespace"
	LabelPod       = "pod"
	LabelContainer = "container"
	// LabelDRAClaimName, LabelDRAClaimNamespace and LabelDRADeviceName name
	// the holder's ResourceClaim and its allocated DRA device, as
	// dcgm-exporter does for the DRA driver it follows.
	LabelDRAClaimName      = "dra_claim_name"
	LabelDRAClaimNamespace = "dra_claim_namespace"
	LabelDRADeviceName     = "dra_device_name"
)

// Labels lists every label of a dcgm-compatible series, in exposition order.
var Labels = []string{LabelGPU, LabelUUID, LabelPCIBusID, LabelDevice, LabelModelName, LabelHostname,
	LabelGPUInstanceProfile, LabelGPUInstanceID, LabelNamespace, LabelPod, LabelContainer,
	LabelDRAClaimName, LabelDRAClaimNamespace, LabelDRADeviceName}
