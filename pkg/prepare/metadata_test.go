package prepare

import (
	"context"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// Every prepared device carries its metadata (KEP-5304): the attributes it is published with,
// and what only prepare knows (a dynamic MIG device's UUID).
func TestDeviceMetadata(t *testing.T) {
	opts, node, _ := vfioOptions(t, Options{})
	d := startTestDriver(t, opts, node)
	migDevice := firstDynamicMIG(t, d, 1)
	vfioDevice, _ := vfioGPU(node, 2)
	str := func(a resourceapi.DeviceAttribute) string {
		if a.StringValue == nil {
			return ""
		}
		return *a.StringValue
	}
	for _, tc := range []struct {
		device string
		gpu    int
		check  func(t *testing.T, attrs map[string]resourceapi.DeviceAttribute)
	}{
		{"gpu-0", 0, func(t *testing.T, attrs map[string]resourceapi.DeviceAttribute) {
			if got := str(attrs[vocabulary.AttrUUID]); got != node.GPUs[0].UUID {
				t.Errorf("uuid %q, want %s", got, node.GPUs[0].UUID)
			}
		}},
		{migDevice, 1, func(t *testing.T, attrs map[string]resourceapi.DeviceAttribute) {
			if got := str(attrs[vocabulary.AttrUUID]); !strings.HasPrefix(got, "MIG-") {
				t.Errorf("uuid %q, want the MIG device's", got)
			}
			if got := str(attrs[vocabulary.AttrParentUUID]); got != node.GPUs[1].UUID {
				t.Errorf("parentUUID %q, want %s", got, node.GPUs[1].UUID)
			}
		}},
		{vfioDevice, 2, func(t *testing.T, attrs map[string]resourceapi.DeviceAttribute) {
			if got := str(attrs[vocabulary.AttrType]); got != string(vocabulary.KindVFIO) {
				t.Errorf("type %q, want vfio", got)
			}
			if got, want := str(attrs[vocabulary.AttrVFIODevice]), fmt.Sprintf("/dev/vfio/%d", node.Machine.IOMMUGroup(2)); got != want {
				t.Errorf("vfioDevice %q, want %s", got, want)
			}
			if got := str(attrs[vocabulary.AttrUUID]); got != node.GPUs[2].UUID {
				t.Errorf("uuid %q, want %s", got, node.GPUs[2].UUID)
			}
		}},
	} {
		t.Run(tc.device, func(t *testing.T) {
			claim := allocated("c-"+tc.device, []string{tc.device})
			res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
			if err != nil || res[claim.UID].Err != nil {
				t.Fatalf("prepare: %v %v", err, res[claim.UID].Err)
			}
			devs := res[claim.UID].Devices
			if len(devs) != 1 || devs[0].Metadata == nil {
				t.Fatalf("devices %+v, want one with metadata", devs)
			}
			attrs := devs[0].Metadata.Attributes
			// The metadata API takes at most 32 attributes a device.
			if len(attrs) > 32 {
				t.Errorf("%d attributes, the metadata API takes 32", len(attrs))
			}
			g := node.GPUs[tc.gpu]
			if got := str(attrs[vocabulary.AttrPCIBusID]); got != g.PCIBusID {
				t.Errorf("pciBusID %q, want %s", got, g.PCIBusID)
			}
			if n := attrs[vocabulary.AttrNUMANode].IntValue; n == nil || *n != int64(g.NUMANode) {
				t.Errorf("numaNode %v, want %d", n, g.NUMANode)
			}
			tc.check(t, attrs)
		})
	}
}
