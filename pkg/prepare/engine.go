// Package prepare implements the kubelet side of the DRA driver: it prepares
// and unprepares ResourceClaims (kubeletplugin.DRAPlugin) over the devices
// discovery found, recording progress in a crash-safe checkpoint and handing
// devices to containers through CDI specs. What differs between device
// kinds (whole GPU, MIG device, time-slice and MPS share) is in one handler
// per kind (handler.go); the engine does the rest the same way for all.
package prepare

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/cdi"
	"github.com/gpu-dra/gpu-dra-driver/pkg/checkpoint"
	"github.com/gpu-dra/gpu-dra-driver/pkg/devicemodel"
	"github.com/gpu-dra/gpu-dra-driver/pkg/keyedmutex"
	"github.com/gpu-dra/gpu-dra-driver/pkg/mig"
	"github.com/gpu-dra/gpu-dra-driver/pkg/podattribution"
	"github.com/gpu-dra/gpu-dra-driver/pkg/telemetry"
)

// Options configure an Engine.
type Options struct {
	DriverName string
	// PoolName is the node's pool; results from other pools are rejected.
	PoolName string
	// MIG creates and destroys the claims' MIG devices (mig.NewNode).
	MIG MIG
	// Store keeps the checkpoint (checkpoint.NewFileStore over
	// CheckpointPath).
	Store Store
	CDI   cdi.Writer
	// Metrics records prepare/unprepare figures; nil records nothing.
	Metrics *telemetry.DriverMetrics
	// Pods, if set, is used in the background to find which containers use
	// a prepared claim, for the container label of device metrics.
	Pods corev1client.PodsGetter
	// Claims, if set with Pods, is used at start to find the pods of
	// claims prepared before a restart, for the same labels.
	Claims resourceclient.ResourceClaimsGetter
	// ProcRoot is where the host's /proc is, to find the pod and container
	// of a process on a GPU (ProcessOwners); empty means /proc.
	ProcRoot string
	// TimeSlicing and MPS set GPUs up for shares; nil refuses such shares.
	TimeSlicing TimeSlicing
	MPS         MPS
	// CheckpointPath is the checkpoint file Store keeps; its directory
	// must exist. A corrupt one is copied aside there, and the intents of
	// MIG instances being created are kept beside it.
	CheckpointPath string
	// Fatal is called for background errors that retrying cannot fix
	// (e.g. ResourceSlices the API server rejects); it should stop the
	// process with the error as its reason.
	Fatal func(error)
	// Passthrough binds GPUs to vfio-pci and back for passthrough
	// devices (passthrough.Host); nil refuses them.
	Passthrough Passthrough
	// Channels serves the IMEX channels of compute domains; nil refuses
	// them.
	Channels Channels
	// FaultHook, if set, is called with the name of each step between
	// side effects of prepare and unprepare, so crash tests can kill the
	// process at every point that matters.
	FaultHook func(point string)
}

// MIG is what the engine does with MIG devices, on GPUs named by UUID;
// *mig.Node implements it over NVML.
type MIG interface {
	// Create makes the MIG device of a profile at a placement, adopting one
	// left by an earlier try; record is called once the GPU is reached and
	// before anything is created, and its error is returned as is.
	Create(ctx context.Context, gpuUUID string, profileID uint32, placement mig.Placement, record func() error) (*mig.Instance, error)
	// Destroy removes the MIG device of a profile at a placement; one that
	// does not exist counts as destroyed.
	Destroy(ctx context.Context, gpuUUID string, profileID uint32, placement mig.Placement) error
	// EnsureOff turns MIG mode off on a GPU without MIG devices, for whole
	// use and shares.
	EnsureOff(ctx context.Context, gpuUUID string) error
	// CapDeviceNodes lists the capability nodes a container needs to use
	// a MIG device.
	CapDeviceNodes(gpuMinor int, giID, ciID uint32) ([]string, error)
}

// Passthrough is what the engine does with passthrough devices;
// passthrough.Host implements it over sysfs and NVML.
type Passthrough interface {
	// Take binds a GPU to vfio-pci, refusing while anything uses it;
	// it finishes what an earlier try began.
	Take(ctx context.Context, gpuUUID, pciBusID string) error
	// Give binds it back to nvidia, whatever step Take or Give reached.
	Give(ctx context.Context, pciBusID string) error
	// DeviceNodes are the VFIO nodes a virtual machine needs for it.
	DeviceNodes(pciBusID string) ([]string, error)
}

// Store loads and saves the checkpoint; checkpoint.NewFileStore implements
// it. The engine never calls it concurrently.
type Store interface {
	Load(ctx context.Context) (*checkpoint.Checkpoint, error)
	Save(ctx context.Context, c *checkpoint.Checkpoint) error
}

// Engine is the DRAPlugin: the prepare engine. Claims touching different GPUs are prepared in
// parallel: the only node-wide lock guards the in-memory checkpoint and its
// (short) save, never device work.
type Engine struct {
	opts  Options
	locks *keyedMutex
	store Store
	// claimLocks serialize the prepare, unprepare and stale release
	// (ReleaseClaim) of one claim, by UID; a claim's lock is taken before
	// its GPUs' locks.
	claimLocks keyedmutex.Mutex
	// health reports device health to the kubelet; set once by SetHealth.
	health Health

	// devices are the published devices by name; set once by SetDevices.
	devices   map[string]*devicemodel.Published
	published []devicemodel.Published
	// attribution names the pods and containers using each prepared claim,
	// processes the pod and container of a process on a GPU.
	attribution *podattribution.Attribution
	processes   *podattribution.Processes

	mu sync.Mutex // guards cp and batch
	cp *checkpoint.Checkpoint
	// batch collects changes for the next group commit (commit.go);
	// saveMu lets one save run at a time.
	batch  *commitBatch
	saveMu sync.Mutex
	// missingSpecs are prepared claims found without a CDI spec at start.
	missingSpecs []types.UID
	// problems are the claims recovery kept as they were, with why.
	problems map[types.UID]string
	// preparedChanged is signaled after every prepare and unprepare (observe.go).
	preparedChanged chan struct{}
	// inflight are the operations in progress, for Stalled (inflight.go).
	inflight inflight
}

var _ kubeletplugin.DRAPlugin = (*Engine)(nil)

// New builds the driver and reconciles node state left by a previous run:
// half-prepared claims are rolled back (MIG instances they created are
// destroyed), CDI specs nobody owns are removed, and a corrupt checkpoint is
// quarantined and rebuilt from the CDI specs. Discover the devices after New
// (so they reflect the cleaned-up state) and hand them to SetDevices.
func New(ctx context.Context, opts Options) (*Engine, error) {
	switch {
	case opts.MIG == nil:
		return nil, errors.New("prepare engine: Options.MIG is not set")
	case opts.Store == nil:
		return nil, errors.New("prepare engine: Options.Store is not set")
	}
	d := &Engine{
		opts:        opts,
		devices:     map[string]*devicemodel.Published{},
		locks:       newKeyedMutex(),
		store:       opts.Store,
		attribution: podattribution.New(opts.Pods),
		problems:    map[types.UID]string{},

		preparedChanged: make(chan struct{}, 1),
	}
	procRoot := opts.ProcRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	d.processes = podattribution.NewProcesses(procRoot, d.attribution)
	if err := d.recover(ctx); err != nil {
		return nil, err
	}
	go d.attribution.Run(ctx)
	if opts.Pods != nil && opts.Claims != nil {
		go d.attributePrepared(ctx)
	}
	return d, nil
}

// SetDevices hands the driver the devices the node publishes, then writes
// again any CDI spec a prepared claim is missing. Call it once, before the
// kubelet can reach the driver.
func (d *Engine) SetDevices(ctx context.Context, devices []devicemodel.Published) {
	d.published = devices
	for i := range devices {
		d.devices[devices[i].Device.Name] = &devices[i]
	}
	d.rewriteMissingSpecs(ctx)
	if err := d.reconcileShares(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Reconcile sharing state")
	}
}

// OwnsMIG reports whether the driver created the MIG GPU instance, i.e. a
// claim in the checkpoint holds it. The device model publishes other
// instances as static MIG devices.
func (d *Engine) OwnsMIG(parentUUID string, giID uint32) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cp.OwnsMIG(parentUUID, giID)
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Engine) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		start, end := time.Now(), d.inflight.begin("prepare of claim "+claim.Namespace+"/"+claim.Name)
		devices, err := d.prepareClaim(ctx, claim)
		end()
		d.observe(true, d.claimKind(claim.UID), start, err)
		if err != nil {
			err = fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, err)
		} else {
			d.attribution.Record(ctx, claim)
		}
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
	}
	d.finishTeardowns(ctx)
	return result, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Engine) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		start, kind := time.Now(), d.claimKind(claim.UID)
		end := d.inflight.begin("unprepare of claim " + claim.String())
		err := d.unprepareClaim(ctx, claim)
		end()
		d.observe(false, kind, start, err)
		if err != nil {
			result[claim.UID] = fmt.Errorf("unprepare claim %s: %w", claim, err)
		} else {
			d.attribution.Forget(claim.UID)
			result[claim.UID] = nil
		}
	}
	d.finishTeardowns(ctx)
	return result, nil
}

// HandleError implements kubeletplugin.DRAPlugin.
func (d *Engine) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) && d.opts.Fatal != nil {
		d.opts.Fatal(fmt.Errorf("%s: %w", msg, err))
	}
}

// PreparedClaims returns a copy of the checkpointed claims, for status and tests.
func (d *Engine) PreparedClaims() []checkpoint.PreparedClaim {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []checkpoint.PreparedClaim
	for _, c := range d.cp.All() {
		out = append(out, *c)
	}
	return out
}

// save persists the checkpoint; the caller holds d.mu.
func (d *Engine) save(ctx context.Context) error {
	if err := d.store.Save(ctx, d.cp); err != nil {
		return fmt.Errorf("save checkpoint: %w", err)
	}
	return nil
}

func cloneCheckpoint(cp *checkpoint.Checkpoint) *checkpoint.Checkpoint {
	out := checkpoint.New()
	for _, c := range cp.All() {
		out.Put(cloneClaim(c))
	}
	return out
}
