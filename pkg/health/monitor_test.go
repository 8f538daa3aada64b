package health

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// eventDeadline is how fast an injected event must change the health state.
const eventDeadline = time.Second

type fixture struct {
	machine *nvmlsim.Machine
	clock   *testingclock.FakeClock
	opts    Options

	polled chan struct{}

	mu     sync.Mutex
	events []Event
}

// newFixture simulates a DGX A100. Polling runs on a fake clock, so state
// changes before a Step come from NVML events alone.
func newFixture(t *testing.T, simOpts ...nvmlsim.Option) *fixture {
	t.Helper()
	m, err := nvmlsim.New("dgxa100", simOpts...)
	if err != nil {
		t.Fatal(err)
	}
	if ret := m.Init(); ret != nvml.SUCCESS {
		t.Fatalf("init: %v", ret)
	}
	t.Cleanup(func() { m.Shutdown() })
	f := &fixture{machine: m, clock: testingclock.NewFakeClock(t0), polled: make(chan struct{}, 1)}
	var gpus []string
	for i := 0; i < m.GPUCount(); i++ {
		gpus = append(gpus, m.GPUUUID(i))
	}
	f.opts = Options{
		NVML:           m,
		GPUs:           gpus,
		StateFile:      filepath.Join(t.TempDir(), "health.json"),
		RecoveryWindow: 10 * time.Minute,
		PollInterval:   time.Minute,
		EventTimeout:   50 * time.Millisecond,
		Clock:          f.clock,
		OnEvent: func(e Event) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.events = append(f.events, e)
		},
	}
	return f
}

// start creates and starts a monitor; it is stopped (and its goroutines
// awaited) at the end of the test.
func (f *fixture) start(t *testing.T) *Monitor {
	t.Helper()
	mon := f.newMonitor(t)
	ctx, cancel := context.WithCancel(context.Background())
	if err := mon.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-mon.Done():
		case <-time.After(5 * time.Second):
			t.Error("monitor did not stop")
		}
	})
	return mon
}

// newMonitor creates a monitor that signals f.polled after each poll. The
// initial poll in Start is drained.
func (f *fixture) newMonitor(t *testing.T) *Monitor {
	t.Helper()
	mon, err := NewMonitor(f.opts)
	if err != nil {
		t.Fatal(err)
	}
	first := true
	mon.afterPoll = func() {
		if first { // Start's own poll
			first = false
			return
		}
		select {
		case f.polled <- struct{}{}:
		default:
		}
	}
	return mon
}

// stop stops a monitor and waits for it.
func stop(t *testing.T, mon *Monitor, cancel context.CancelFunc) {
	t.Helper()
	cancel()
	select {
	case <-mon.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("monitor did not stop")
	}
}

// step advances the fake clock and waits until the poller has run.
func (f *fixture) step(t *testing.T, mon *Monitor, d time.Duration) {
	t.Helper()
	f.clock.Step(d)
	select {
	case <-f.polled:
	case <-time.After(eventDeadline):
		t.Fatalf("no poll within %v of advancing the clock by %v", eventDeadline, d)
	}
}

// waitFor waits until cond holds for GPU uuid's status, or fails after
// eventDeadline.
func waitFor(t *testing.T, mon *Monitor, uuid string, what string, cond func(Status) bool) Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), eventDeadline)
	defer cancel()
	start := time.Now()
	for snap := range mon.Subscribe(ctx) {
		if cond(snap[uuid]) {
			t.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
			return snap[uuid]
		}
	}
	st := mon.Snapshot()[uuid]
	t.Fatalf("GPU %s not %s within %v: %+v", uuid, what, eventDeadline, st)
	return st
}

func unhealthy(s Status) bool { return s.Unhealthy != nil }
func healthy(s Status) bool   { return s.Healthy() }

func (f *fixture) sawEvent(match func(Event) bool) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.events {
		if match(e) {
			return true
		}
	}
	return false
}

func TestCriticalXIDMakesGPUUnhealthyWithinASecond(t *testing.T) {
	for _, xid := range []uint64{79, 48} {
		t.Run(XIDReason(xid), func(t *testing.T) {
			f := newFixture(t)
			mon := f.start(t)
			uuid := f.machine.GPUUUID(2)
			f.machine.InjectEvent(2, nvml.EventTypeXidCriticalError, xid)
			st := waitFor(t, mon, uuid, "unhealthy", unhealthy)
			if st.Unhealthy.Reason != XIDReason(xid) || !st.Unhealthy.Since.Equal(t0) {
				t.Errorf("condition %+v, want reason %s since %v", st.Unhealthy, XIDReason(xid), t0)
			}
			for i := 0; i < f.machine.GPUCount(); i++ {
				if i != 2 && !mon.Snapshot()[f.machine.GPUUUID(i)].Healthy() {
					t.Errorf("GPU %d unhealthy too", i)
				}
			}
		})
	}
}

func TestDoubleBitECCEventMakesGPUUnhealthy(t *testing.T) {
	f := newFixture(t)
	mon := f.start(t)
	f.machine.InjectEvent(0, nvml.EventTypeDoubleBitEccError, 0)
	st := waitFor(t, mon, f.machine.GPUUUID(0), "unhealthy", unhealthy)
	if st.Unhealthy.Reason != ReasonDoubleBitECC {
		t.Errorf("reason %s, want %s", st.Unhealthy.Reason, ReasonDoubleBitECC)
	}
}

func TestIgnoredXIDKeepsGPUHealthy(t *testing.T) {
	f := newFixture(t)
	mon := f.start(t)
	f.machine.InjectEvent(1, nvml.EventTypeXidCriticalError, 13)
	deadline := time.Now().Add(eventDeadline)
	for !f.sawEvent(func(e Event) bool { return e.XID == 13 }) {
		if time.Now().After(deadline) {
			t.Fatal("XID 13 not delivered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !f.sawEvent(func(e Event) bool { return e.XID == 13 && e.Ignored }) {
		t.Error("XID 13 not reported as ignored")
	}
	if st := mon.Snapshot()[f.machine.GPUUUID(1)]; !st.Healthy() {
		t.Errorf("GPU unhealthy after an ignored XID: %+v", st)
	}
}

func TestConfiguredIgnoredXIDs(t *testing.T) {
	f := newFixture(t)
	f.opts.IgnoredXIDs = []uint64{48}
	mon := f.start(t)
	f.machine.InjectEvent(0, nvml.EventTypeXidCriticalError, 48)
	f.machine.InjectEvent(1, nvml.EventTypeXidCriticalError, 13) // no longer ignored
	waitFor(t, mon, f.machine.GPUUUID(1), "unhealthy", unhealthy)
	if !f.sawEvent(func(e Event) bool { return e.XID == 48 && e.Ignored }) {
		t.Error("XID 48 not seen as ignored")
	}
	if st := mon.Snapshot()[f.machine.GPUUUID(0)]; !st.Healthy() {
		t.Errorf("GPU 0 unhealthy after an ignored XID 48: %+v", st)
	}
}

func TestLostGPUIsNoExecuteAndRecoversWhenBack(t *testing.T) {
	f := newFixture(t)
	mon := f.start(t)
	uuid := f.machine.GPUUUID(3)
	policy := DefaultTaintPolicy("gpu.dra.dev")

	if err := f.machine.SetGPULost(3, true); err != nil {
		t.Fatal(err)
	}
	// The driver's XID 79 arrives as an event at once.
	st := waitFor(t, mon, uuid, "unhealthy", unhealthy)
	if taints := Taints(st, nil, policy); len(taints) != 1 || taints[0].Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Errorf("taints after XID 79: %v, want one NoExecute", taints)
	}
	// The poller confirms the GPU is lost.
	f.step(t, mon, time.Minute)
	st = waitFor(t, mon, uuid, "lost", func(s Status) bool { return s.Lost })
	taints := Taints(st, nil, policy)
	if len(taints) != 1 || taints[0].Value != ReasonGPULost || taints[0].Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Errorf("taints of a lost GPU: %v, want %s NoExecute", taints, ReasonGPULost)
	}
	// A lost GPU stays unhealthy however long it is quiet.
	f.step(t, mon, time.Hour)
	if st := mon.Snapshot()[uuid]; !st.Lost {
		t.Fatalf("lost GPU recovered by the window: %+v", st)
	}
	// Back on the bus (reset): healthy at the next probe.
	if err := f.machine.SetGPULost(3, false); err != nil {
		t.Fatal(err)
	}
	f.step(t, mon, time.Minute)
	waitFor(t, mon, uuid, "healthy", healthy)
}

func TestRecoveryAfterQuietWindow(t *testing.T) {
	// Without the recovery action field (older drivers): the XID table and the window decide.
	f := newFixture(t, nvmlsim.WithoutRecoveryAction())
	mon := f.start(t)
	uuid := f.machine.GPUUUID(5)
	f.machine.InjectEvent(5, nvml.EventTypeXidCriticalError, 48)
	waitFor(t, mon, uuid, "unhealthy", unhealthy)

	f.step(t, mon, 9*time.Minute)
	// A new event restarts the window.
	f.machine.InjectEvent(5, nvml.EventTypeXidCriticalError, 48)
	waitFor(t, mon, uuid, "hit twice", func(s Status) bool { return s.Unhealthy != nil && s.Unhealthy.Events == 2 })
	f.step(t, mon, 9*time.Minute)
	if st := mon.Snapshot()[uuid]; st.Healthy() {
		t.Fatal("GPU recovered 9 minutes after its last event, window is 10")
	}
	f.step(t, mon, time.Minute)
	st := waitFor(t, mon, uuid, "healthy", healthy)
	if st.Unhealthy != nil {
		t.Errorf("condition left: %+v", st.Unhealthy)
	}
}

func TestResetObservedThroughECCCounter(t *testing.T) {
	f := newFixture(t)
	nv := &resettableNVML{Interface: f.machine, offset: map[string]uint64{}}
	f.opts.NVML = nv
	uuid := f.machine.GPUUUID(4)
	f.machine.InjectEvent(4, nvml.EventTypeDoubleBitEccError, 0) // before the monitor: only raises the counter
	mon := f.start(t)
	f.machine.InjectEvent(4, nvml.EventTypeDoubleBitEccError, 0)
	waitFor(t, mon, uuid, "unhealthy", unhealthy)
	f.step(t, mon, time.Minute) // baseline: 2 uncorrected errors

	nv.reset(uuid)
	f.step(t, mon, time.Minute)
	waitFor(t, mon, uuid, "healthy after reset", healthy)
}

// resettableNVML is the simulated NVML plus a GPU reset's effect on the
// volatile ECC counters, which the simulation does not model.
type resettableNVML struct {
	nvml.Interface
	mu     sync.Mutex
	offset map[string]uint64
}

// reset clears GPU uuid's volatile ECC counters, as a GPU reset does.
func (r *resettableNVML) reset(uuid string) {
	dev, _ := r.Interface.DeviceGetHandleByUUID(uuid)
	n, _ := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.offset[uuid] = n
}

func (r *resettableNVML) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	dev, ret := r.Interface.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return dev, ret
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return eccOffsetDevice{Device: dev, offset: r.offset[uuid]}, ret
}

type eccOffsetDevice struct {
	nvml.Device
	offset uint64
}

func (d eccOffsetDevice) GetTotalEccErrors(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
	n, ret := d.Device.GetTotalEccErrors(t, c)
	if c == nvml.VOLATILE_ECC {
		n -= min(n, d.offset)
	}
	return n, ret
}

func TestMIGAttributedErrors(t *testing.T) {
	f := newFixture(t)
	mon := f.start(t)
	uuid := f.machine.GPUUUID(0)
	inst := MIGInstance{GPUInstance: 7, ComputeInstance: 0}

	// A contained ECC error in one MIG instance marks that instance only.
	f.machine.InjectMigEvent(0, inst.GPUInstance, inst.ComputeInstance, nvml.EventTypeXidCriticalError, 94)
	st := waitFor(t, mon, uuid, "MIG instance unhealthy", func(s Status) bool { return len(s.MIG) == 1 })
	if st.Unhealthy != nil {
		t.Errorf("whole GPU unhealthy after XID 94 in a MIG instance: %+v", st.Unhealthy)
	}
	if c := st.ConditionFor(&inst); c == nil || c.Reason != "XID94" {
		t.Errorf("condition of %v: %+v, want XID94", inst, c)
	}
	if c := st.ConditionFor(&MIGInstance{GPUInstance: 1, ComputeInstance: 0}); c != nil {
		t.Errorf("another MIG instance affected: %+v", c)
	}

	// An uncontained one concerns the whole GPU.
	f.machine.InjectMigEvent(0, inst.GPUInstance, inst.ComputeInstance, nvml.EventTypeXidCriticalError, 95)
	st = waitFor(t, mon, uuid, "GPU unhealthy", unhealthy)
	if st.Unhealthy.Reason != "XID95" {
		t.Errorf("reason %s, want XID95", st.Unhealthy.Reason)
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	// Without the recovery action field (older drivers): the XID table and the window decide.
	f := newFixture(t, nvmlsim.WithoutRecoveryAction())
	uuid := f.machine.GPUUUID(6)

	mon := f.newMonitor(t)
	ctx, cancel := context.WithCancel(context.Background())
	if err := mon.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.machine.InjectEvent(6, nvml.EventTypeXidCriticalError, 64)
	waitFor(t, mon, uuid, "unhealthy", unhealthy)
	stop(t, mon, cancel)

	// Restarted 5 minutes later: still unhealthy, with the original times.
	f.clock.Step(5 * time.Minute)
	mon2 := f.start(t)
	st := mon2.Snapshot()[uuid]
	if st.Unhealthy == nil || st.Unhealthy.Reason != "XID64" || !st.Unhealthy.Since.Equal(t0) {
		t.Fatalf("after restart: %+v, want XID64 since %v", st.Unhealthy, t0)
	}
	// Healthy once the window since the event has passed.
	f.step(t, mon2, 5*time.Minute)
	waitFor(t, mon2, uuid, "healthy", healthy)
}

func TestRestartAfterWindowStartsHealthy(t *testing.T) {
	// Without the recovery action field (older drivers): the XID table and the window decide.
	f := newFixture(t, nvmlsim.WithoutRecoveryAction())
	uuid := f.machine.GPUUUID(1)
	mon := f.newMonitor(t)
	ctx, cancel := context.WithCancel(context.Background())
	if err := mon.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.machine.InjectEvent(1, nvml.EventTypeXidCriticalError, 74)
	waitFor(t, mon, uuid, "unhealthy", unhealthy)
	stop(t, mon, cancel)

	f.clock.Step(time.Hour)
	mon2 := f.start(t)
	if st := mon2.Snapshot()[uuid]; !st.Healthy() {
		t.Errorf("unhealthy after restarting past the window: %+v", st)
	}
}

func TestRebootDropsState(t *testing.T) {
	// Without the recovery action field (older drivers): the XID table and the window decide.
	f := newFixture(t, nvmlsim.WithoutRecoveryAction())
	f.opts.BootID = "boot-1"
	uuid := f.machine.GPUUUID(1)
	mon := f.newMonitor(t)
	ctx, cancel := context.WithCancel(context.Background())
	if err := mon.Start(ctx); err != nil {
		t.Fatal(err)
	}
	f.machine.InjectEvent(1, nvml.EventTypeXidCriticalError, 48)
	waitFor(t, mon, uuid, "unhealthy", unhealthy)
	stop(t, mon, cancel)

	f.opts.BootID = "boot-2"
	mon2 := f.start(t)
	if st := mon2.Snapshot()[uuid]; !st.Healthy() {
		t.Errorf("unhealthy after a reboot: %+v", st)
	}
}

func TestCorruptStateFileIsMovedAside(t *testing.T) {
	f := newFixture(t)
	if err := os.WriteFile(f.opts.StateFile, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	mon, err := NewMonitor(f.opts)
	if err == nil || mon == nil {
		t.Fatalf("NewMonitor = %v, %v; want a monitor and an error", mon, err)
	}
	if _, err := os.Stat(f.opts.StateFile + ".corrupt"); err != nil {
		t.Errorf("corrupt file not moved aside: %v", err)
	}
}

// TestEventTimeoutMustBeWholeMilliseconds checks that NewMonitor refuses
// an event timeout NVML's millisecond wait would round: under 1ms it would
// be 0, a wait that returns at once, and the event loop would spin.
func TestEventTimeoutMustBeWholeMilliseconds(t *testing.T) {
	tests := map[string]struct {
		timeout time.Duration
		wantErr bool
	}{
		"unset means the default":    {timeout: 0},
		"negative means the default": {timeout: -time.Second},
		"1ms":                        {timeout: time.Millisecond},
		"the largest wait":           {timeout: math.MaxUint32 * time.Millisecond},
		"500µs":                      {timeout: 500 * time.Microsecond, wantErr: true},
		"1ns":                        {timeout: 1, wantErr: true},
		"1.5ms":                      {timeout: 1500 * time.Microsecond, wantErr: true},
		"past a uint32 of ms":        {timeout: (math.MaxUint32 + 1) * time.Millisecond, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.opts.StateFile = ""
			f.opts.EventTimeout = tc.timeout
			mon, err := NewMonitor(f.opts)
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), "Options.EventTimeout") {
					t.Fatalf("NewMonitor = %v, %v; want an error naming Options.EventTimeout", mon, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewMonitor: %v", err)
			}
		})
	}
}

func TestWatchHealthStatus(t *testing.T) {
	f := newFixture(t)
	mon := f.start(t)
	uuid := f.machine.GPUUUID(0)
	devices := []Device{
		{Pool: "node-1", Name: "gpu-0", GPUUUID: uuid},
		{Pool: "node-1", Name: "gpu-0-ts", GPUUUID: uuid},
		{Pool: "node-1", Name: "gpu-1", GPUUUID: f.machine.GPUUUID(1)},
		{Pool: "node-1", Name: "gpu-9", GPUUUID: "GPU-unknown"},
	}
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan kubeletplugin.DeviceHealthReport)
	errCh := make(chan error, 1)
	go func() { errCh <- mon.WatchHealthStatus(ctx, reports, func() []Device { return devices }) }()

	health := func(r kubeletplugin.DeviceHealthReport) map[string]kubeletplugin.HealthStatus {
		out := map[string]kubeletplugin.HealthStatus{}
		for _, d := range r.Devices {
			out[d.DeviceName] = d.Health
			if d.PoolName != "node-1" || d.HealthCheckTimeout != DefaultReportTimeout {
				t.Errorf("device %s: pool %q, timeout %v", d.DeviceName, d.PoolName, d.HealthCheckTimeout)
			}
		}
		return out
	}
	first := health(<-reports)
	want := map[string]kubeletplugin.HealthStatus{"gpu-0": "Healthy", "gpu-0-ts": "Healthy", "gpu-1": "Healthy", "gpu-9": "Unknown"}
	for name, h := range want {
		if first[name] != h {
			t.Errorf("initial report: %s is %s, want %s", name, first[name], h)
		}
	}

	start := time.Now()
	f.machine.InjectEvent(0, nvml.EventTypeXidCriticalError, 48)
	select {
	case r := <-reports:
		got := health(r)
		if got["gpu-0"] != "Unhealthy" || got["gpu-0-ts"] != "Unhealthy" || got["gpu-1"] != "Healthy" {
			t.Errorf("report after XID 48 on GPU 0: %v", got)
		}
		for _, d := range r.Devices {
			if d.DeviceName == "gpu-0" && d.Message == "" {
				t.Error("unhealthy device without a message")
			}
		}
		t.Logf("report after %v", time.Since(start).Round(time.Millisecond))
	case <-time.After(eventDeadline):
		t.Fatal("no report within a second of the event")
	}

	// Re-sent without changes within the lease.
	f.clock.Step(DefaultReportTimeout / 3)
	select {
	case <-reports:
	case <-time.After(eventDeadline):
		t.Fatal("report not re-sent")
	}
	cancel()
	if err := <-errCh; err != nil {
		t.Errorf("WatchHealthStatus: %v", err)
	}
}
