package health

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-dra/gpu-dra-driver/pkg/nvmlsim"
)

// withBootIDFile gives the monitor the simulated machine's boot ID file, so
// that nvmlsim's Reboot is seen as one.
func (f *fixture) withBootIDFile(t *testing.T) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "driver-root")
	if err := f.machine.WriteDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	f.opts.BootIDFile = nvmlsim.BootIDFile(root)
}

// TestRecoveryActionKeepsGPUUnhealthy: an XID whose recovery action (as the
// simulated hardware reports it) is a reset or a reboot keeps the GPU tainted
// past the recovery window, with the action in the taint value, until that
// action is seen done; an XID without an action recovers through the window.
func TestRecoveryActionKeepsGPUUnhealthy(t *testing.T) {
	for name, tc := range map[string]struct {
		xid        uint64
		action     Action
		taintValue string
		// perform does what the action asks for; nil: nothing needed.
		perform func(m *nvmlsim.Machine, gpu int) error
		// resetIsNotEnough: a GPU reset alone leaves the GPU unhealthy.
		resetIsNotEnough bool
	}{
		"DBE: reset":                 {48, ActionReset, "XID48-reset-required", (*nvmlsim.Machine).ResetGPU, false},
		"row remap: drain and reset": {63, ActionDrainAndReset, "XID63-drain-and-reset-required", (*nvmlsim.Machine).ResetGPU, false},
		"GSP error: reset":           {119, ActionReset, "XID119-reset-required", (*nvmlsim.Machine).ResetGPU, false},
		"off the bus: reboot": {79, ActionReboot, "XID79-reboot-required",
			func(m *nvmlsim.Machine, _ int) error { return m.Reboot() }, true},
		"contained ECC: window": {94, "", "XID94", nil, false},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.withBootIDFile(t)
			mon := f.start(t)
			const gpu = 2
			uuid := f.machine.GPUUUID(gpu)
			f.machine.InjectEvent(gpu, nvml.EventTypeXidCriticalError, tc.xid)
			st := waitFor(t, mon, uuid, "unhealthy", unhealthy)
			if st.Unhealthy.Action != tc.action {
				t.Errorf("action %q, want %q", st.Unhealthy.Action, tc.action)
			}
			if taints := Taints(st, nil, DefaultTaintPolicy("gpu.dra.dev")); len(taints) != 1 || taints[0].Value != tc.taintValue {
				t.Errorf("taints %v, want one with value %s", taints, tc.taintValue)
			}
			f.step(t, mon, 11*time.Minute) // past the 10-minute window
			if tc.perform == nil {
				waitFor(t, mon, uuid, "healthy after the window", healthy)
				return
			}
			if st := mon.Snapshot()[uuid]; st.Unhealthy == nil || st.Unhealthy.Action != tc.action {
				t.Fatalf("after the window: %+v, want still unhealthy awaiting %s", st, tc.action)
			}
			if tc.resetIsNotEnough {
				if err := f.machine.ResetGPU(gpu); err != nil {
					t.Fatal(err)
				}
				f.step(t, mon, time.Minute)
				if st := mon.Snapshot()[uuid]; st.Healthy() {
					t.Fatalf("a GPU reset ended a condition that needs a reboot")
				}
			}
			if err := tc.perform(f.machine, gpu); err != nil {
				t.Fatal(err)
			}
			f.step(t, mon, time.Minute)
			waitFor(t, mon, uuid, "healthy once the action is done", healthy)
		})
	}
}

// TestRecoveryActionUnsupportedFallsBack: where NVML answers NOT_SUPPORTED
// for the field, XID 48 behaves as before it existed: taint value XID48, and
// healthy after the window.
func TestRecoveryActionUnsupportedFallsBack(t *testing.T) {
	f := newFixture(t, nvmlsim.WithoutRecoveryAction())
	mon := f.start(t)
	uuid := f.machine.GPUUUID(1)
	f.machine.InjectEvent(1, nvml.EventTypeXidCriticalError, 48)
	st := waitFor(t, mon, uuid, "unhealthy", unhealthy)
	if taints := Taints(st, nil, DefaultTaintPolicy("gpu.dra.dev")); len(taints) != 1 || taints[0].Value != "XID48" {
		t.Errorf("taints %v, want value XID48", taints)
	}
	f.step(t, mon, 11*time.Minute)
	waitFor(t, mon, uuid, "healthy after the window", healthy)
	mon.mu.Lock()
	defer mon.mu.Unlock()
	if !mon.actionUnsupported[uuid] {
		t.Error("the unsupported field was not noted (and logged) for the GPU")
	}
}

// TestRecoveryActionAcrossRestarts: a restart on the same boot keeps a
// pending reset or reboot, even past the window; a reset done while the
// plugin was down, or a reboot, ends it at start. A pending action the
// hardware reports without any event seen makes the GPU unhealthy too.
func TestRecoveryActionAcrossRestarts(t *testing.T) {
	f := newFixture(t)
	f.withBootIDFile(t)
	resetGPU, rebootGPU, quietGPU := f.machine.GPUUUID(4), f.machine.GPUUUID(5), f.machine.GPUUUID(6)
	// run starts a monitor, runs during, and returns the snapshot from
	// before during; the next restart comes long after the window.
	run := func(during func(*Monitor)) Snapshot {
		t.Helper()
		mon := f.newMonitor(t)
		ctx, cancel := context.WithCancel(context.Background())
		if err := mon.Start(ctx); err != nil {
			t.Fatal(err)
		}
		snap := mon.Snapshot()
		if during != nil {
			during(mon)
		}
		stop(t, mon, cancel)
		f.clock.Step(time.Hour)
		return snap
	}
	action := func(snap Snapshot, uuid string) Action {
		if c := snap[uuid].Unhealthy; c != nil {
			return c.Action
		}
		return "healthy"
	}
	run(func(mon *Monitor) {
		f.machine.InjectEvent(4, nvml.EventTypeXidCriticalError, 48)
		f.machine.InjectEvent(5, nvml.EventTypeXidCriticalError, 79)
		waitFor(t, mon, resetGPU, "awaiting a reset", func(s Status) bool { return s.Unhealthy != nil && s.Unhealthy.Action == ActionReset })
		waitFor(t, mon, rebootGPU, "awaiting a reboot", func(s Status) bool { return s.Unhealthy != nil && s.Unhealthy.Action == ActionReboot })
	})
	// The plugin is down while a GPU starts needing a reset: no event seen.
	f.machine.InjectEvent(6, nvml.EventTypeXidCriticalError, 64)

	snap := run(nil)
	if action(snap, resetGPU) != ActionReset || action(snap, rebootGPU) != ActionReboot {
		t.Errorf("restart on the same boot, past the window: %q, %q; want reset and reboot still pending",
			action(snap, resetGPU), action(snap, rebootGPU))
	}
	if c := snap[quietGPU].Unhealthy; c == nil || c.Reason != ReasonRecoveryAction || c.Action != ActionReset {
		t.Errorf("GPU needing a reset with no event seen: %+v, want reason %s awaiting a reset", c, ReasonRecoveryAction)
	}

	// Reset while the plugin is down: healthy at start; the reboot is still pending.
	for _, i := range []int{4, 5, 6} {
		if err := f.machine.ResetGPU(i); err != nil {
			t.Fatal(err)
		}
	}
	snap = run(nil)
	if action(snap, resetGPU) != "healthy" || action(snap, quietGPU) != "healthy" || action(snap, rebootGPU) != ActionReboot {
		t.Errorf("restart after GPU resets: %q, %q, %q; want healthy, healthy, reboot pending",
			action(snap, resetGPU), action(snap, quietGPU), action(snap, rebootGPU))
	}

	// Restart after a reboot: healthy.
	if err := f.machine.Reboot(); err != nil {
		t.Fatal(err)
	}
	if snap = run(nil); action(snap, rebootGPU) != "healthy" {
		t.Errorf("restart after a reboot: %q, want healthy", action(snap, rebootGPU))
	}
}
