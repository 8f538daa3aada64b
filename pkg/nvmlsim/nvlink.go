package nvmlsim

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// NVLink: every link of a DGX GPU goes to an NVSwitch (12 links to 6 NVSwitches on DGX A100,
// 18 to 4 NVSwitch chips on DGX H100/H200, 18 to 2 on DGX B200). Hopper and later GPUs report a
// completed NVLink fabric with the machine's (or its rack's, rack.go) cluster UUID and clique; Ampere GPUs have no
// fabric manager state (GetGpuFabricInfo is NOT_SUPPORTED), and L4 has no NVLink at all.

// linkCheck validates link for GPU g: INVALID_ARGUMENT outside NVML's range, NOT_SUPPORTED for
// links the GPU does not have.
func (g *gpu) linkCheck(link int) nvml.Return {
	if link < 0 || link >= nvml.NVLINK_MAX_LINKS {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if link >= g.m.spec.nvlink.links() {
		return nvml.ERROR_NOT_SUPPORTED
	}
	return nvml.SUCCESS
}

func (g *gpu) setNvLinkFuncs(d *mock.Device) {
	nl := &g.m.spec.nvlink
	if nl.links() > 0 {
		d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
			if ret := g.linkCheck(link); ret != nvml.SUCCESS {
				return 0, ret
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetNvLinkVersionFunc = func(link int) (uint32, nvml.Return) {
			if ret := g.linkCheck(link); ret != nvml.SUCCESS {
				return 0, ret
			}
			return nl.version, nvml.SUCCESS
		}
		d.GetNvLinkRemoteDeviceTypeFunc = func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
			if ret := g.linkCheck(link); ret != nvml.SUCCESS {
				return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, ret
			}
			return nvml.NVLINK_DEVICE_TYPE_SWITCH, nvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
			if ret := g.linkCheck(link); ret != nvml.SUCCESS {
				return nvml.PciInfo{}, ret
			}
			// NVSwitch PCI device 0x1af1 (third generation, DGX A100) / 0x22a3 (later).
			id := uint32(0x22A310DE)
			if nl.version == 3 {
				id = 0x1AF110DE
			}
			return pciInfo(0, nl.switchBuses[nl.switchOf(link)], id, 0), nvml.SUCCESS
		}
	}
	// Without NVLink, the NVLink getters keep the default ERROR_NOT_SUPPORTED.
	if !nl.fabric {
		return // GetGpuFabricInfo and _v4 stay ERROR_NOT_SUPPORTED
	}
	cluster, clique := g.m.fabricCluster()
	d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		return nvml.GpuFabricInfo{
			ClusterUuid: cluster,
			Status:      uint32(nvml.SUCCESS),
			CliqueId:    clique,
			State:       nvml.GPU_FABRIC_STATE_COMPLETED,
		}, nvml.SUCCESS
	}
	d.GetGpuFabricInfo_v4Func = func() (nvml.GpuFabricInfo_v4, nvml.Return) {
		info := nvml.GpuFabricInfo_v4{
			ClusterUuid: cluster,
			Status:      uint32(nvml.SUCCESS),
			NumCliques:  1,
			State:       nvml.GPU_FABRIC_STATE_COMPLETED,
		}
		info.Cliques[0].Id = clique
		return info, nvml.SUCCESS
	}
}
