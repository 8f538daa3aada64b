package campaign

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	at "github.com/gpu-dra/gpu-dra-driver/internal/allocatortest"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
)

// kindAdmin is a claim with admin access (monitoring) to devices that
// prepared claims hold, or to the static MIG device.
const kindAdmin = "admin"

// newAdminAction returns, now and then, the prepare of a fresh admin-access
// claim beside an exclusive holder; nil otherwise or when no device is
// held. Its results are written here as the scheduler writes them:
// kube-scheduler 1.37.2 does not fit admin access to a device whose
// counters a holder consumes (kubernetes#140729). A holder's dynamic MIG
// device is reached through its parent GPU: the device exists only while
// the holder's claim does, which a concurrent unprepare may end.
func (r *run) newAdminAction() *action {
	if r.rng.IntN(6) > 0 {
		return nil
	}
	avoid := r.avoid()
	var targets []string
	add := func(device string) {
		if m := gpuOfDevice.FindStringSubmatch(device); m != nil && r.published[device] && !slices.Contains(targets, device) {
			var g int
			_, _ = fmt.Sscan(m[1], &g)
			if !avoid[g] {
				targets = append(targets, device)
			}
		}
	}
	for _, c := range r.sortedClaims() {
		if c.state != prepared || c.kind == kindAdmin {
			continue
		}
		for _, d := range c.devices() {
			if (strings.Contains(d, "-mig-") && !strings.Contains(d, "-mig-gi")) || strings.HasSuffix(d, "-vfio") {
				// A dynamic MIG device's or a passthrough GPU's whole GPU
				// (admin access to a passthrough device is refused).
				d = "gpu-" + gpuOfDevice.FindStringSubmatch(d)[1]
			}
			add(d)
		}
	}
	for d := range r.published {
		if strings.Contains(d, "-mig-gi") {
			add(d) // the static MIG device
		}
	}
	if len(targets) == 0 {
		return nil
	}
	slices.Sort(targets)
	r.names++
	name := fmt.Sprintf("c%d-%s", r.names, kindAdmin)
	obj := adminClaim(name, targets[r.rng.IntN(len(targets))])
	if err := publishClaim(r.dirs.Root, obj); err != nil {
		r.t.Fatal(err)
	}
	c := &claim{obj: obj, kind: kindAdmin, state: pendingPrepare, born: r.ops}
	r.claims[c.uid()] = c
	return &action{c: c, prepare: true}
}

// adminClaim is a claim allocated with admin access to device.
func adminClaim(name, device string) *resourceapi.ResourceClaim {
	req := at.Exactly("admin", driverName, 1)
	req.Exactly.AdminAccess = ptr.To(true)
	obj := at.Claim(name, req)
	obj.UID = types.UID(name + "-uid")
	obj.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "admin", Driver: driverName, Pool: nodeName, Device: device, AdminAccess: ptr.To(true),
		}},
	}}
	return obj
}

// checkNoDeviceTwice is the invariant that no device, nor share of a device, is
// in the checkpoint for two claims; admin access is used beside a holder
// and is exempt. (The physical overlaps of different devices of one GPU
// are pkg/prepare's conflict tests'.)
func checkNoDeviceTwice(cp *checkpoint.Checkpoint, fail func(string, ...any)) {
	holder := map[string]types.UID{}
	for uid, e := range cp.All() {
		for _, d := range e.Devices {
			if d.AdminAccess {
				continue
			}
			key := d.Device
			if d.ShareID != "" {
				key += "#" + d.ShareID
			}
			if other, ok := holder[key]; ok && other != uid {
				fail("device %s is prepared for two claims: %s and %s (%s/%s)", key, other, uid, e.Namespace, e.Name)
			}
			holder[key] = uid
		}
	}
}

// checkNoDeviceTwice reports a device or share held by two claims, and only
// that: admin access beside a holder, and two shares of one device, pass.
func TestCheckNoDeviceTwice(t *testing.T) {
	dev := func(name, shareID string, admin bool) checkpoint.PreparedDevice {
		return checkpoint.PreparedDevice{Device: name, ShareID: shareID, AdminAccess: admin}
	}
	for name, tc := range map[string]struct {
		a, b checkpoint.PreparedDevice
		want bool
	}{
		"one GPU, two claims":        {dev("gpu-0", "", false), dev("gpu-0", "", false), true},
		"one share, two claims":      {dev("gpu-0-ts", "s1", false), dev("gpu-0-ts", "s1", false), true},
		"two shares of one device":   {dev("gpu-0-ts", "s1", false), dev("gpu-0-ts", "s2", false), false},
		"admin access beside holder": {dev("gpu-0", "", false), dev("gpu-0", "", true), false},
		"holder beside admin access": {dev("gpu-0", "", true), dev("gpu-0", "", false), false},
	} {
		t.Run(name, func(t *testing.T) {
			cp := checkpoint.New()
			cp.Put(&checkpoint.PreparedClaim{UID: "a", Devices: []checkpoint.PreparedDevice{tc.a}})
			cp.Put(&checkpoint.PreparedClaim{UID: "b", Devices: []checkpoint.PreparedDevice{tc.b}})
			var got []string
			checkNoDeviceTwice(cp, func(f string, args ...any) { got = append(got, fmt.Sprintf(f, args...)) })
			if (len(got) > 0) != tc.want {
				t.Errorf("checkNoDeviceTwice reported %q, want a report %v", got, tc.want)
			}
		})
	}
}
