package prepare

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// deviceMetadata is what the containers of a prepared device (a VM
// launcher, a job) read of it in the device metadata file the kubelet
// plugin helper writes (KEP-5304, when the plugin enables it): the
// attributes the device is published with (UUID, PCI address, NUMA node,
// PCIe root, product, ...) and what only prepare knows, a dynamic MIG
// device's UUID (its GPU's is parentUUID), a passthrough device's VFIO
// group device (vfioDevice, /dev/vfio/<group>). A device not published at
// this start (its GPU lost) gets what its record knows.
func (d *Engine) deviceMetadata(pd checkpoint.PreparedDevice) *kubeletplugin.DeviceMetadata {
	attrs := map[string]resourceapi.DeviceAttribute{}
	if pub, ok := d.devices[pd.Device]; ok {
		for name, v := range pub.Device.Attributes {
			attrs[string(name)] = v
		}
	}
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
	switch {
	case pd.Kind == vocabulary.KindMIG && len(pd.UUIDs) > 0:
		attrs[vocabulary.AttrUUID] = str(pd.UUIDs[0])
		attrs[vocabulary.AttrParentUUID] = str(gpuUUIDOf(pd))
	case pd.GPUUUID != "":
		if _, ok := attrs[vocabulary.AttrUUID]; !ok {
			attrs[vocabulary.AttrUUID] = str(pd.GPUUUID)
		}
	}
	if pd.VFIOPCIBusID != "" {
		attrs[vocabulary.AttrPCIBusID] = str(pd.VFIOPCIBusID)
		if d.opts.Passthrough != nil {
			// The first node is the group's (handler_vfio.go gives the
			// same nodes to the containers); without it the launcher
			// still finds the group from the PCI address in sysfs.
			if nodes, err := d.opts.Passthrough.DeviceNodes(pd.VFIOPCIBusID); err == nil && len(nodes) > 0 {
				attrs[vocabulary.AttrVFIODevice] = str(nodes[0])
			}
		}
	}
	if _, ok := attrs[vocabulary.AttrType]; !ok && pd.Kind != "" {
		attrs[vocabulary.AttrType] = str(string(pd.Kind))
	}
	return &kubeletplugin.DeviceMetadata{Attributes: attrs}
}
