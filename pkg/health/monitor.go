package health

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Defaults of Options.
const (
	DefaultRecoveryWindow = 10 * time.Minute
	DefaultPollInterval   = 5 * time.Second
	DefaultEventTimeout   = 500 * time.Millisecond
)

// Options configure a Monitor.
type Options struct {
	// NVML is an initialized NVML; it must stay initialized until Done is
	// closed.
	NVML nvml.Interface
	// GPUs are the UUIDs of the physical GPUs to watch. Their MIG devices
	// are covered through them.
	GPUs []string
	// StateFile keeps the health state across restarts; its directory must
	// exist. Empty: not persisted.
	StateFile string
	// BootID is the kernel's boot ID (/proc/sys/kernel/random/boot_id).
	// When set and different from the one in the state file, the node has
	// rebooted, every GPU was reset, and the persisted conditions are
	// dropped. Empty: conditions survive reboots too.
	BootID string
	// BootIDFile, if set, is read for the boot ID instead of BootID (when
	// readable) at start and again at every poll, so that a boot ID that
	// changes under a running monitor (a simulated reboot) counts as a
	// reboot too.
	BootIDFile string
	// IgnoredXIDs never make a GPU unhealthy. Nil means DefaultIgnoredXIDs;
	// an empty non-nil slice ignores none.
	IgnoredXIDs []uint64
	// GPUWideXIDs mark the whole GPU even when attributed to a MIG
	// instance. Nil means DefaultGPUWideXIDs.
	GPUWideXIDs []uint64
	// RecoveryWindow is how long a GPU (or MIG instance) must stay free of
	// critical events to become healthy again. Zero means
	// DefaultRecoveryWindow; negative means never (only a GPU reset
	// recovers).
	RecoveryWindow time.Duration
	// PollInterval is how often each GPU is probed for being lost or
	// reset and conditions are expired. Zero means DefaultPollInterval.
	PollInterval time.Duration
	// EventTimeout bounds each NVML event wait, and so how long stopping
	// takes. Zero means DefaultEventTimeout.
	EventTimeout time.Duration
	// ReportTimeout is the HealthCheckTimeout of WatchHealthStatus's
	// reports. Zero means DefaultReportTimeout.
	ReportTimeout time.Duration
	// OnEvent, if set, is called for every health event seen, critical or
	// ignored (for metrics). It must not block.
	OnEvent func(Event)
	// Clock drives timestamps, polling and recovery; tests pass a fake.
	// Nil means the real clock.
	Clock clock.WithTicker
}

// Monitor watches GPUs through NVML and keeps their health. Create it with
// NewMonitor, then call Start once.
type Monitor struct {
	opts    Options
	clock   clock.WithTicker
	ignored map[uint64]bool
	gpuWide map[uint64]bool
	done    chan struct{}

	mu     sync.Mutex
	states map[string]*Status // by GPU UUID
	subs   map[chan Snapshot]struct{}
	// eccUncorrected is the last volatile uncorrected ECC count per GPU;
	// a decrease means the GPU was reset.
	eccUncorrected map[string]uint64
	// bootID is the boot ID the state is recorded for.
	bootID string
	// actionUnsupported: GPUs whose recovery action NVML cannot report
	// (logged once).
	actionUnsupported map[string]bool
	started           bool
	stopped           bool
	// afterPoll, if set, is called after each poll (tests).
	afterPoll func()
}

// maxEventTimeout is the longest wait nvmlEventSetWait takes: its timeout
// is an unsigned 32-bit count of milliseconds.
const maxEventTimeout = math.MaxUint32 * time.Millisecond

// checkEventTimeout refuses an event timeout that NVML cannot wait exactly:
// its wait counts in whole milliseconds, so less than 1ms would become 0,
// which returns at once and makes the event loop spin, and 1.5ms would
// become 1ms.
func checkEventTimeout(d time.Duration) error {
	if d < time.Millisecond || d%time.Millisecond != 0 || d > maxEventTimeout {
		return fmt.Errorf("health monitor: Options.EventTimeout %v: must be a whole number of milliseconds from 1ms to %v, "+
			"the wait NVML's event set can do", d, maxEventTimeout)
	}
	return nil
}

// NewMonitor returns a monitor for opts.GPUs with the persisted state
// loaded. A corrupt state file is moved aside and reported as an error
// together with a usable monitor (every GPU healthy); other errors return a
// nil monitor.
func NewMonitor(opts Options) (*Monitor, error) {
	if opts.NVML == nil {
		return nil, errors.New("health monitor: NVML is required")
	}
	if opts.IgnoredXIDs == nil {
		opts.IgnoredXIDs = DefaultIgnoredXIDs
	}
	if opts.GPUWideXIDs == nil {
		opts.GPUWideXIDs = DefaultGPUWideXIDs
	}
	if opts.RecoveryWindow == 0 {
		opts.RecoveryWindow = DefaultRecoveryWindow
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.EventTimeout <= 0 {
		opts.EventTimeout = DefaultEventTimeout
	}
	if err := checkEventTimeout(opts.EventTimeout); err != nil {
		return nil, err
	}
	if opts.ReportTimeout <= 0 {
		opts.ReportTimeout = DefaultReportTimeout
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	m := &Monitor{
		opts:           opts,
		clock:          opts.Clock,
		ignored:        xidSet(opts.IgnoredXIDs),
		gpuWide:        xidSet(opts.GPUWideXIDs),
		done:           make(chan struct{}),
		states:         map[string]*Status{},
		subs:           map[chan Snapshot]struct{}{},
		eccUncorrected: map[string]uint64{},
		bootID:         opts.BootID,

		actionUnsupported: map[string]bool{},
	}
	if opts.BootIDFile != "" {
		if id := readBootID(opts.BootIDFile); id != "" {
			m.bootID = id
		}
	}
	for _, uuid := range opts.GPUs {
		m.states[uuid] = &Status{UUID: uuid}
	}
	if opts.StateFile == "" {
		return m, nil
	}
	st, loadErr := loadState(opts.StateFile)
	if st == nil {
		return nil, loadErr
	}
	rebooted := m.bootID != "" && st.BootID != "" && st.BootID != m.bootID
	for _, s := range st.GPUs {
		// GPUs no longer on the node are dropped; a GPU that comes back
		// after being lost was reset anyway.
		if _, ok := m.states[s.UUID]; ok && !rebooted {
			m.states[s.UUID] = &s
		}
	}
	return m, loadErr
}

// Start probes every GPU once, registers for its NVML events and starts the
// monitor's goroutines (one event loop per GPU and one poller), which run
// until ctx is canceled; Done is closed when they have stopped and released
// their NVML event sets. When Start returns, Snapshot is current and events
// are being received (on every GPU that is reachable and supports them).
func (m *Monitor) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.started {
		m.mu.Unlock()
		return errors.New("health monitor already started")
	}
	m.started = true
	m.mu.Unlock()
	logger := klog.LoggerWithName(klog.FromContext(ctx), "health")
	ctx = klog.NewContext(ctx, logger)

	m.poll(ctx) // a lost GPU, or one reset while we were down, is known before anything is published
	m.persist(ctx)
	ticker := m.clock.NewTicker(m.opts.PollInterval) // before Start returns, so fake clocks see it
	var wg sync.WaitGroup
	for _, uuid := range m.opts.GPUs {
		// Registered before Start returns: no event is missed from then on.
		set, err := m.register(ctx, uuid)
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.watch(ctx, uuid, set, err)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C():
				m.poll(ctx)
			}
		}
	}()
	go func() {
		wg.Wait()
		m.mu.Lock()
		m.stopped = true
		for ch := range m.subs {
			close(ch)
			delete(m.subs, ch)
		}
		m.mu.Unlock()
		close(m.done)
	}()
	logger.Info("Started GPU health monitoring", "gpus", len(m.opts.GPUs),
		"ignoredXIDs", FormatXIDs(m.opts.IgnoredXIDs), "recoveryWindow", m.opts.RecoveryWindow)
	return nil
}

// Done is closed once the goroutines started by Start have stopped.
func (m *Monitor) Done() <-chan struct{} { return m.done }

// Snapshot returns the current health of every monitored GPU.
func (m *Monitor) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snapshotLocked()
}

func (m *Monitor) snapshotLocked() Snapshot {
	snap := make(Snapshot, len(m.states))
	for uuid, s := range m.states {
		snap[uuid] = s.clone()
	}
	return snap
}

// Subscribe returns a channel that receives the current snapshot at once and
// then a new one after every change. A slow reader misses intermediate
// snapshots but always gets the latest. The channel is closed when ctx is
// canceled or the monitor stops.
func (m *Monitor) Subscribe(ctx context.Context) <-chan Snapshot {
	ch := make(chan Snapshot, 1)
	m.mu.Lock()
	defer m.mu.Unlock()
	ch <- m.snapshotLocked()
	if m.stopped {
		close(ch)
		return ch
	}
	m.subs[ch] = struct{}{}
	go func() {
		select {
		case <-ctx.Done():
		case <-m.done:
			return // closed by the monitor
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if _, ok := m.subs[ch]; ok {
			delete(m.subs, ch)
			close(ch)
		}
	}()
	return ch
}

// ObserveReset records that GPU uuid was reset (for example by the driver
// itself, or an administrator through a future API): its conditions, and
// those of its MIG instances, are cleared at once.
func (m *Monitor) ObserveReset(ctx context.Context, uuid, why string) {
	m.update(ctx, uuid, func(s *Status) bool {
		changed := s.clear(false)
		switch {
		case changed && s.Unhealthy != nil:
			klog.FromContext(ctx).Info("GPU reset observed, still waiting for a reboot", "gpu", uuid, "how", why)
		case changed:
			klog.FromContext(ctx).Info("GPU healthy again: reset observed", "gpu", uuid, "how", why)
		}
		return changed
	})
}

// update applies change to GPU uuid's status under the lock; if it reports
// a change, the state is persisted and subscribers are notified.
func (m *Monitor) update(ctx context.Context, uuid string, change func(*Status) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.states[uuid]
	if !ok || !change(s) {
		return
	}
	m.changedLocked(ctx)
}

// changedLocked persists the state and notifies subscribers. m.mu is held.
func (m *Monitor) changedLocked(ctx context.Context) {
	m.persistLocked(ctx)
	snap := m.snapshotLocked()
	for ch := range m.subs {
		select { // drop a snapshot the reader has not taken yet: the new one supersedes it
		case <-ch:
		default:
		}
		ch <- snap
	}
}

func (m *Monitor) persist(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.persistLocked(ctx)
}

func (m *Monitor) persistLocked(ctx context.Context) {
	if m.opts.StateFile == "" {
		return
	}
	if err := saveState(m.opts.StateFile, m.bootID, m.states); err != nil {
		// The in-memory state stays authoritative; the next change retries.
		klog.FromContext(ctx).Error(err, "Persist GPU health state", "file", m.opts.StateFile)
	}
}

// handleEvent classifies an event and applies it if it is critical.
func (m *Monitor) handleEvent(ctx context.Context, e Event) {
	logger := klog.FromContext(ctx)
	if e.Type == EventXID && m.ignored[e.XID] {
		e.Ignored = true
	}
	if e.Type == EventXID && m.gpuWide[e.XID] {
		e.MIG = nil
	}
	if m.opts.OnEvent != nil {
		m.opts.OnEvent(e)
	}
	if e.Ignored {
		logger.V(2).Info("Ignoring XID", "gpu", e.GPUUUID, "xid", e.XID, "mig", e.MIG)
		return
	}
	// What the hardware asks for after this error decides how the condition
	// ends; an action concerns the whole GPU, whatever instance reported it.
	action, _ := m.recoveryAction(ctx, e.GPUUUID)
	if action != "" {
		e.MIG = nil
	}
	m.update(ctx, e.GPUUUID, func(s *Status) bool {
		wasHealthy := s.ConditionFor(e.MIG) == nil
		s.apply(e, e.Time)
		if action != "" {
			s.applyAction(action, e.Time)
		}
		reason, msg := e.reason()
		if wasHealthy {
			logger.Info("GPU unhealthy", "gpu", e.GPUUUID, "reason", reason, "message", msg, "recoveryAction", action)
		} else {
			logger.V(2).Info("Critical event on unhealthy GPU", "gpu", e.GPUUUID, "reason", reason, "message", msg, "recoveryAction", action)
		}
		return true
	})
}

// setLost records whether GPU uuid is lost. A GPU that is reachable again
// after being lost was reset: it becomes healthy.
func (m *Monitor) setLost(ctx context.Context, uuid string, lost bool) {
	logger := klog.FromContext(ctx)
	m.update(ctx, uuid, func(s *Status) bool {
		switch {
		case lost && !s.Lost:
			s.setLost(m.clock.Now())
			logger.Info("GPU lost", "gpu", uuid)
			if m.opts.OnEvent != nil {
				m.opts.OnEvent(Event{GPUUUID: uuid, Type: EventGPULost, Time: m.clock.Now()})
			}
			return true
		case !lost && s.Lost:
			s.clear(false)
			if s.Unhealthy != nil {
				logger.Info("GPU reachable again after being lost, still waiting for its recovery action", "gpu", uuid, "action", s.Unhealthy.Action)
			} else {
				logger.Info("GPU healthy again: reachable after being lost (reset)", "gpu", uuid)
			}
			return true
		}
		return false
	})
}

// expire makes GPUs and MIG instances whose recovery window has passed
// healthy.
func (m *Monitor) expire(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	changed := false
	for _, uuid := range slices.Sorted(maps.Keys(m.states)) {
		s := m.states[uuid]
		before := s.clone()
		if s.expire(now, m.opts.RecoveryWindow) {
			changed = true
			if s.Healthy() {
				klog.FromContext(ctx).Info("GPU healthy again: no critical event within the recovery window",
					"gpu", uuid, "window", m.opts.RecoveryWindow, "reason", reasonOf(before))
			}
		}
	}
	if changed {
		m.changedLocked(ctx)
	}
}

func reasonOf(s Status) string {
	if s.Unhealthy != nil {
		return s.Unhealthy.Reason
	}
	if len(s.MIG) > 0 {
		return s.MIG[0].Reason
	}
	return ""
}

// String describes a status for logs.
func (s Status) String() string {
	if s.Healthy() {
		return "healthy"
	}
	return fmt.Sprintf("unhealthy (%s)", reasonOf(s))
}

// observeAction applies the recovery action NVML now reports for GPU uuid:
// a pending one is recorded (raising a condition if the GPU had none); none
// pending any more, where one was recorded, means it was done, except that
// only a new boot ends one that needs a reboot (when the boot ID is known).
func (m *Monitor) observeAction(ctx context.Context, uuid string, a Action) {
	logger := klog.FromContext(ctx)
	m.update(ctx, uuid, func(s *Status) bool {
		if a != "" {
			wasHealthy := s.Unhealthy == nil
			changed := s.applyAction(a, m.clock.Now())
			if changed && wasHealthy {
				logger.Info("GPU unhealthy: NVML reports a recovery action pending", "gpu", uuid, "action", a)
			}
			return changed
		}
		if s.Unhealthy == nil || s.Unhealthy.Action == "" {
			return false
		}
		done := s.Unhealthy.Action
		if done.needsReboot() && m.bootID != "" {
			return false
		}
		s.clear(done.needsReboot())
		logger.Info("GPU healthy again: NVML reports its recovery action done", "gpu", uuid, "action", done)
		return true
	})
}

// checkBoot treats a change of the boot ID file under a running monitor as a
// reboot: every condition ends, a pending reboot included.
func (m *Monitor) checkBoot(ctx context.Context) {
	if m.opts.BootIDFile == "" {
		return
	}
	id := readBootID(m.opts.BootIDFile)
	m.mu.Lock()
	defer m.mu.Unlock()
	if id == "" || id == m.bootID {
		return
	}
	old := m.bootID
	m.bootID = id
	for uuid, s := range m.states {
		if s.clear(true) {
			klog.FromContext(ctx).Info("GPU healthy again: the node rebooted", "gpu", uuid, "bootID", id, "before", old)
		}
	}
	m.changedLocked(ctx)
}
