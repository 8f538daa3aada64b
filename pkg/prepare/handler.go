package prepare

import (
	"context"
	"fmt"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
)

// kindHandler is what the engine knows of one kind of device: the steps of
// preparing and unpreparing it that differ between kinds. The engine does
// the rest (locks, checkpoint states, CDI specs, rollback) the same way for
// every kind. Adding a kind is adding a handler to kindHandlers.
type kindHandler interface {
	// plan checks the config of an allocated device and completes its
	// record (pd has the allocation's identity, kind and GPU) with what a
	// restart needs to find and undo its work; it returns what prepare
	// needs beyond the record.
	plan(pub *devicemodel.Published, r resourceapi.DeviceRequestAllocationResult, cfg gpuv1beta1.Config, pd *checkpoint.PreparedDevice) (shareInput, error)
	// prepare does the device's work for a claim recorded as
	// PrepareStarted, recording progress in pd (a part of entry) and
	// saving entry after each step a crash must know about.
	prepare(ctx context.Context, d *Engine, entry *checkpoint.PreparedClaim, pd *checkpoint.PreparedDevice, in shareInput) error
	// unprepare undoes prepare, tolerating work that was never done or is
	// already undone (a crash at any point, a rollback run again).
	unprepare(ctx context.Context, d *Engine, claimUID types.UID, pd *checkpoint.PreparedDevice) error
	// containerEdits adds what a container needs of the device beyond
	// what every kind gets (the GPU's node, the share's edits); pub is nil
	// when the device is not published at this start.
	containerEdits(d *Engine, pub *devicemodel.Published, pd *checkpoint.PreparedDevice, cd *cdi.ClaimDevice) error
	// durableStart says whether the PrepareStarted record must be durable
	// before prepare's work: true when that work leaves something outside
	// the CDI spec that outlives a crash of the plugin and must be found
	// and undone (a MIG instance, a sharing setting, an MPS daemon).
	// Recovery finds an orphaned spec by itself (docs/checkpoint.md).
	durableStart() bool
	// strategy is the sharing strategy the plugin sets up for the device,
	// "" for none.
	strategy(pd *checkpoint.PreparedDevice) gpuv1beta1.SharingStrategy
	// conflict says why a, a device of this kind, and b, a device of a
	// known kind on the same physical GPU, cannot be in use at the same
	// time, or "" if they can.
	conflict(gpu string, a, b checkpoint.PreparedDevice) string
}

// kindHandlers are the device kinds this release prepares, by the kind the
// device model publishes (devicemodel.Published.Kind) and the checkpoint
// records (checkpoint.PreparedDevice.Kind). A checkpoint entry with a kind
// not listed here was written by a newer release and is left untouched
// (foreignEntry).
var kindHandlers = map[vocabulary.Kind]kindHandler{
	vocabulary.KindGPU:         gpuHandler{},
	vocabulary.KindMIG:         migHandler{},
	vocabulary.KindTimeSlice:   shareHandler{want: gpuv1beta1.TimeSlicingStrategy, manager: timeSliceManager{}},
	vocabulary.KindMPS:         shareHandler{want: gpuv1beta1.MPSStrategy, manager: mpsManager{}},
	vocabulary.KindVFIO:        vfioHandler{},
	vocabulary.KindIMEXChannel: channelHandler{},
}

// knownKind reports whether this release knows how to prepare and undo a
// device of the kind.
func knownKind(kind vocabulary.Kind) bool {
	_, ok := kindHandlers[kind]
	return ok
}

// handlerOf is the handler of a recorded device.
func handlerOf(pd *checkpoint.PreparedDevice) (kindHandler, error) {
	h, ok := kindHandlers[pd.Kind]
	if !ok {
		return nil, fmt.Errorf("device %s: unknown device type %q", pd.Device, pd.Kind)
	}
	return h, nil
}

// plannedDevice is the checkpoint record of one allocated device before any
// work is done: enough to find and undo that work after a crash.
func plannedDevice(pub *devicemodel.Published, r resourceapi.DeviceRequestAllocationResult, cfg gpuv1beta1.Config) (checkpoint.PreparedDevice, shareInput, error) {
	pd := checkpoint.PreparedDevice{
		Request: r.Request, Pool: r.Pool, Device: r.Device,
		Kind: pub.Kind, GPUUUID: pub.GPU.UUID,
	}
	if r.ShareID != nil {
		pd.ShareID = string(*r.ShareID)
	}
	h, err := handlerOf(&pd)
	if err != nil {
		return pd, shareInput{}, err
	}
	if isAdmin(r) {
		return pd, shareInput{}, planAdmin(h, pub, r, &pd)
	}
	in, err := h.plan(pub, r, cfg, &pd)
	return pd, in, err
}

// shareStrategy is the sharing strategy a prepared device has the plugin
// set up, "" for none (admin access sets none up). A record of a kind this
// release does not know keeps the MPS daemon it records inside its MIG
// device: reconciling must not stop what a newer release's claim may use.
func shareStrategy(pd *checkpoint.PreparedDevice) gpuv1beta1.SharingStrategy {
	if pd.AdminAccess {
		return "" // admin access sets no sharing up
	}
	if h, ok := kindHandlers[pd.Kind]; ok {
		return h.strategy(pd)
	}
	return mpsInsideMIG(pd)
}
