package nodeplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpu-dra/gpu-dra-driver/pkg/handover"
	"github.com/gpu-dra/gpu-dra-driver/pkg/liveness"
	"github.com/gpu-dra/gpu-dra-driver/pkg/prepare"
)

// serving is what the instance serves to the kubelet: the helper's
// sockets, whose calls wait behind a handover.Gate until the instance owns
// the node, and the probes; and, once it owns the node, its ResourceSlices
// (a helper of their own, which stops before the hand-over lock goes while
// the sockets still answer the calls the gate forwards). In a rolling update (--pod-uid) they start
// before the instance waits for the hand-over lock, so that the new
// instance registers and becomes Ready while the old one still owns the
// node: the DaemonSet deletes the old pod only then (maxUnavailable 0,
// maxSurge 1). Without a pod UID no other instance serves beside this one,
// and they start once the instance is ready, as they always did.
type serving struct {
	gate   *handover.Gate
	helper *kubeletplugin.Helper          // the sockets
	slices *kubeletplugin.Helper          // the ResourceSlices, set once the instance owns the node
	nvml   atomic.Pointer[nvml.Interface] // set once the instance opened NVML, for the probes
	engine atomic.Pointer[prepare.Engine] // set once the instance owns the node, for the probes
	cancel context.CancelFunc
	once   sync.Once
}

func newServing(fatal context.CancelCauseFunc) *serving {
	return &serving{gate: handover.NewGate(fatal), cancel: func() {}}
}

// start starts the helper and the probes. The helper gets a context of its
// own: a canceled ctx (SIGTERM) must not close the sockets under calls in
// flight, which stop drains first, nor under forwarded calls, which close
// waits for.
func (s *serving) start(ctx context.Context, cfg *Config, client kubernetes.Interface, fatal context.CancelCauseFunc) error {
	helperCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	opts := append(cfg.socketOptions(),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.DriverName(cfg.DriverName),
		// The driver locks per GPU; serializing all calls would make every
		// claim wait for the slowest one on any GPU. The hand-over lock
		// keeps two instances apart.
		kubeletplugin.Serialize(false),
		kubeletplugin.GRPCInterceptor(s.gate.Interceptor()),
	)
	if cfg.PodUID != "" { // calls after Drain go to the newer instance beside this one
		s.gate.ForwardTo(&handover.SocketForwarder{Dir: cfg.PluginDataDir, Own: cfg.draSocketFile()})
	}
	if cfg.DeviceMetadata {
		// v1beta1 is the newest version (1.37); consumers pick the first
		// version they understand from the file's stream.
		opts = append(opts, kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}),
			kubeletplugin.CDIDirectory(cfg.CDIDir))
	}
	helper, err := kubeletplugin.Start(helperCtx, s.gate, opts...)
	if err != nil {
		cancel()
		return fmt.Errorf("start kubelet plugin: %w", err)
	}
	s.helper, s.cancel = helper, cancel
	return startProbes(ctx, cfg, &s.nvml, &s.engine, client, fatal)
}

// own is called once the instance owns the node and has built its plugin:
// the calls waiting at the gate go through; the helper starts now if it
// did not before, and the one that publishes the node's ResourceSlices.
func (s *serving) own(ctx context.Context, cfg *Config, client kubernetes.Interface, fatal context.CancelCauseFunc,
	drv *prepare.Engine, lib nvml.Interface) error {
	s.nvml.Store(&lib)
	s.engine.Store(drv)
	s.gate.Open(drv)
	if s.helper == nil {
		if err := s.start(ctx, cfg, client, fatal); err != nil {
			return err
		}
	}
	// Its own context, as the sockets': stop ends it after the drain.
	slices, err := kubeletplugin.Start(context.WithoutCancel(ctx), s.gate,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.DRAService(false),
		kubeletplugin.RegistrationService(false),
	)
	if err != nil {
		return fmt.Errorf("start publishing ResourceSlices: %w", err)
	}
	s.slices = slices
	return nil
}

// stop hands the node's serving over: new calls are forwarded to the
// newer instance (the kubelet may still send them here while its
// connection to that one is not up) or, without one, refused; the calls in
// flight finish, then the instance stops publishing ResourceSlices. Only
// then may the hand-over lock go. Calls in flight are not cut short: the
// kubelet's call timeout bounds them, and the pod's termination grace
// period bounds the whole.
func (s *serving) stop(ctx context.Context) {
	s.once.Do(func() {
		klog.FromContext(ctx).Info("Stopping: draining the kubelet's calls in flight")
		s.gate.Drain()
		s.slices.Stop() // nil-safe
	})
}

// close ends the serving once the instance let go of the node: it waits
// for the calls forwarded to the newer instance, which that one holds until
// it took the hand-over lock, then removes the sockets, which unregisters
// the instance.
func (s *serving) close(ctx context.Context) {
	s.stop(ctx)
	s.gate.Close()
	s.helper.Stop() // nil-safe
	s.cancel()
}

// acquire waits until this instance owns the node: it holds the hand-over
// lock and, in a rolling update, no instance of a release without the lock
// still serves under the fixed socket name (the first upgrade to a release
// with the lock runs the two side by side too).
func (s *serving) acquire(ctx context.Context, cfg *Config) (*handover.Lock, error) {
	lock, err := handover.Acquire(ctx, cfg.PluginDataDir, cfg.owner(), s.gate.WaitingFor)
	if err != nil || cfg.PodUID == "" {
		return lock, err
	}
	legacy := filepath.Join(cfg.RegistrarDir, cfg.DriverName+"-reg.sock")
	check := liveness.RegistrationSocket(legacy)
	for logged := false; ; logged = true {
		if _, err := os.Stat(legacy); err != nil {
			removeStaleSockets(ctx, cfg)
			return lock, nil
		}
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := check.Run(callCtx)
		cancel()
		if err != nil { // a stale socket: nobody serves there
			removeStaleSockets(ctx, cfg)
			return lock, nil
		}
		if !logged {
			s.gate.WaitingFor(handover.Owner{PodName: "an instance of an earlier release (" + legacy + ")"})
			klog.FromContext(ctx).Info("Waiting for the plugin instance of an earlier release to stop", "socket", legacy)
		}
		select {
		case <-ctx.Done():
			lock.Release(ctx)
			return nil, fmt.Errorf("wait for the instance serving %s to stop: %w", legacy, context.Cause(ctx))
		case <-time.After(time.Second):
		}
	}
}

// removeStaleSockets removes the sockets of this driver's instances that
// died without removing them (killed), which the kubelet would otherwise
// keep trying to register: only those nobody listens on. The lock holder
// calls it, so no older instance still starts up on them.
func removeStaleSockets(ctx context.Context, cfg *Config) {
	own := map[string]bool{
		filepath.Join(cfg.RegistrarDir, cfg.registrationSocketFile()): true,
		filepath.Join(cfg.PluginDataDir, cfg.draSocketFile()):         true,
	}
	reg, _ := filepath.Glob(filepath.Join(cfg.RegistrarDir, cfg.DriverName+"-*-reg.sock"))
	dra, _ := filepath.Glob(filepath.Join(cfg.PluginDataDir, "dra-*.sock"))
	for _, path := range append(reg, dra...) {
		if own[path] {
			continue
		}
		conn, err := net.DialTimeout("unix", path, 5*time.Second)
		if err == nil {
			_ = conn.Close()
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			klog.FromContext(ctx).Error(err, "Remove a dead plugin instance's socket", "socket", path)
			continue
		}
		klog.FromContext(ctx).Info("Removed a dead plugin instance's socket", "socket", path)
	}
}

// owner is what this instance records in the hand-over lock.
func (c *Config) owner() handover.Owner {
	o := handover.Owner{PodUID: c.PodUID}
	if c.PodName != "" {
		o.PodName = c.PodNamespace + "/" + c.PodName
	}
	return o
}
