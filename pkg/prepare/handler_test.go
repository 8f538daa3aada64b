package prepare

import (
	"maps"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

// The handler table and the device model agree: every kind the model
// publishes (on a node with MIG and both sharing strategies) has a handler
// that plans a device of it, and no handler waits for a kind nobody
// publishes. A kind added to the model without a handler fails here.
func TestEveryPublishedKindHasAHandler(t *testing.T) {
	d := newTestDriver(t, nil)
	published := map[vocabulary.Kind]*devicemodel.Published{}
	for i := range d.published {
		p := &d.published[i]
		if _, ok := published[p.Kind]; !ok {
			published[p.Kind] = p
		}
	}
	for kind, pub := range published {
		r := resourceapi.DeviceRequestAllocationResult{Request: "req", Driver: testDriver, Pool: "node-1", Device: pub.Device.Name}
		pd, _, err := plannedDevice(pub, r, nil)
		if err != nil {
			t.Errorf("kind %q (device %s): %v", kind, pub.Device.Name, err)
			continue
		}
		if pd.Kind != kind || !knownKind(pd.Kind) {
			t.Errorf("kind %q (device %s) is recorded as kind %q, known %v", kind, pub.Device.Name, pd.Kind, knownKind(pd.Kind))
		}
	}
	for kind := range kindHandlers {
		if kind == vocabulary.KindIMEXChannel {
			continue // dra-controller publishes channels, in a clique's pool (handler_channel_test.go)
		}
		if _, ok := published[kind]; !ok {
			t.Errorf("handler for kind %q, which the device model does not publish (published: %v)", kind, slices.Sorted(maps.Keys(published)))
		}
	}
}

// A published device of a kind no handler is registered for is refused at
// planning, naming the device and the kind, and nothing is recorded.
func TestUnregisteredKindIsRefused(t *testing.T) {
	d := newTestDriver(t, nil)
	future := *d.devices["gpu-0"]
	future.Kind, future.Device.Name = "vgpu", "vgpu-0"
	d.devices[future.Device.Name] = &future

	err := prepareOne(t, d, allocated("future", []string{"vgpu-0"}))
	if err == nil || !strings.Contains(err.Error(), `device vgpu-0: unknown device type "vgpu"`) {
		t.Fatalf("prepare of a device of an unregistered kind: err = %v, want one naming device vgpu-0 and kind vgpu", err)
	}
	if got := d.PreparedClaims(); len(got) != 0 {
		t.Errorf("a refused claim was recorded: %+v", got)
	}
}
