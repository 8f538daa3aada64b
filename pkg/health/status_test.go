package health

import (
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestStatusTransitions(t *testing.T) {
	mig := &MIGInstance{GPUInstance: 3, ComputeInstance: 0}
	other := &MIGInstance{GPUInstance: 5, ComputeInstance: 0}
	const window = 10 * time.Minute
	tests := map[string]struct {
		steps      func(s *Status)
		at         time.Time // expire at
		wantGPU    string    // reason of the GPU-wide condition, "" = none
		wantMIG    string    // reason for device mig
		wantOther  string    // reason for device other
		wantLost   bool
		wantEvents int
	}{
		"xid marks the GPU": {
			steps:   func(s *Status) { s.apply(Event{Type: EventXID, XID: 48}, t0) },
			at:      t0.Add(window - time.Second),
			wantGPU: "XID48", wantMIG: "XID48", wantOther: "XID48", wantEvents: 1,
		},
		"quiet window heals": {
			steps: func(s *Status) { s.apply(Event{Type: EventXID, XID: 48}, t0) },
			at:    t0.Add(window),
		},
		"window counts from the last event, reason from the first": {
			steps: func(s *Status) {
				s.apply(Event{Type: EventXID, XID: 48}, t0)
				s.apply(Event{Type: EventDoubleBitECC}, t0.Add(5*time.Minute))
			},
			at:      t0.Add(window + time.Minute),
			wantGPU: "XID48", wantMIG: "XID48", wantOther: "XID48", wantEvents: 2,
		},
		"mig event marks only its instance": {
			steps:   func(s *Status) { s.apply(Event{Type: EventXID, XID: 94, MIG: mig}, t0) },
			at:      t0.Add(time.Minute),
			wantMIG: "XID94", wantEvents: 0,
		},
		"mig condition expires": {
			steps: func(s *Status) { s.apply(Event{Type: EventXID, XID: 94, MIG: mig}, t0) },
			at:    t0.Add(window),
		},
		"lost never expires and overrides the reason": {
			steps: func(s *Status) {
				s.apply(Event{Type: EventXID, XID: 79}, t0)
				s.setLost(t0)
			},
			at:      t0.Add(24 * time.Hour),
			wantGPU: ReasonGPULost, wantMIG: ReasonGPULost, wantOther: ReasonGPULost, wantLost: true, wantEvents: 2,
		},
		"reset clears everything": {
			steps: func(s *Status) {
				s.apply(Event{Type: EventXID, XID: 79}, t0)
				s.apply(Event{Type: EventXID, XID: 94, MIG: mig}, t0)
				s.setLost(t0)
				s.clear(false)
			},
			at: t0,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := &Status{UUID: "GPU-1"}
			tc.steps(s)
			s.expire(tc.at, window)
			reason := func(c *Condition) string {
				if c == nil {
					return ""
				}
				return c.Reason
			}
			if got := reason(s.Unhealthy); got != tc.wantGPU {
				t.Errorf("GPU condition %q, want %q", got, tc.wantGPU)
			}
			if got := reason(s.ConditionFor(mig)); got != tc.wantMIG {
				t.Errorf("condition of %v %q, want %q", mig, got, tc.wantMIG)
			}
			if got := reason(s.ConditionFor(other)); got != tc.wantOther {
				t.Errorf("condition of %v %q, want %q", other, got, tc.wantOther)
			}
			if s.Lost != tc.wantLost {
				t.Errorf("lost %v, want %v", s.Lost, tc.wantLost)
			}
			if s.Unhealthy != nil && s.Unhealthy.Events != tc.wantEvents {
				t.Errorf("events %d, want %d", s.Unhealthy.Events, tc.wantEvents)
			}
		})
	}
}

func TestNegativeWindowNeverExpires(t *testing.T) {
	s := &Status{}
	s.apply(Event{Type: EventXID, XID: 48}, t0)
	if s.expire(t0.Add(1000*time.Hour), -1) || s.Unhealthy == nil {
		t.Fatal("condition expired with recovery disabled")
	}
}

func TestMIGConditionWithoutComputeInstanceCoversAll(t *testing.T) {
	s := Status{MIG: []MIGCondition{{MIGInstance: MIGInstance{GPUInstance: 2, ComputeInstance: noInstance}, Condition: Condition{Reason: "XID94"}}}}
	if s.ConditionFor(&MIGInstance{GPUInstance: 2, ComputeInstance: 1}) == nil {
		t.Error("a condition of GPU instance 2 must cover its compute instances")
	}
	if s.ConditionFor(&MIGInstance{GPUInstance: 1, ComputeInstance: 1}) != nil {
		t.Error("a condition of GPU instance 2 must not cover GPU instance 1")
	}
	if s.ConditionFor(nil) != nil {
		t.Error("a MIG condition must not cover the whole GPU")
	}
}

func TestTaints(t *testing.T) {
	p := DefaultTaintPolicy("gpu.dra.dev")
	mig := &MIGInstance{GPUInstance: 1, ComputeInstance: 0}
	tests := map[string]struct {
		st         Status
		mig        *MIGInstance
		wantValue  string
		wantEffect resourceapi.DeviceTaintEffect
	}{
		"healthy": {st: Status{}},
		"double-bit ECC": {
			st:        Status{Unhealthy: &Condition{Reason: ReasonDoubleBitECC, Since: t0}},
			wantValue: ReasonDoubleBitECC, wantEffect: resourceapi.DeviceTaintEffectNoSchedule,
		},
		"fallen off the bus": {
			st:        Status{Unhealthy: &Condition{Reason: "XID79", Since: t0}},
			wantValue: "XID79", wantEffect: resourceapi.DeviceTaintEffectNoExecute,
		},
		"lost": {
			st:        Status{Lost: true, Unhealthy: &Condition{Reason: ReasonGPULost, Since: t0}},
			wantValue: ReasonGPULost, wantEffect: resourceapi.DeviceTaintEffectNoExecute,
		},
		"MIG device of an unhealthy instance": {
			st:        Status{MIG: []MIGCondition{{MIGInstance: *mig, Condition: Condition{Reason: "XID94", Since: t0}}}},
			mig:       mig,
			wantValue: "XID94", wantEffect: resourceapi.DeviceTaintEffectNoSchedule,
		},
		"whole GPU with an unhealthy MIG instance": {
			st: Status{MIG: []MIGCondition{{MIGInstance: *mig, Condition: Condition{Reason: "XID94", Since: t0}}}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			taints := Taints(tc.st, tc.mig, p)
			if tc.wantValue == "" {
				if len(taints) != 0 {
					t.Fatalf("taints %v, want none", taints)
				}
				return
			}
			if len(taints) != 1 {
				t.Fatalf("taints %v, want one", taints)
			}
			got := taints[0]
			if got.Key != "gpu.dra.dev/unhealthy" || got.Value != tc.wantValue || got.Effect != tc.wantEffect {
				t.Errorf("taint %s=%s:%s, want gpu.dra.dev/unhealthy=%s:%s", got.Key, got.Value, got.Effect, tc.wantValue, tc.wantEffect)
			}
			if got.TimeAdded == nil || !got.TimeAdded.Time.Equal(t0) {
				t.Errorf("TimeAdded %v, want %v", got.TimeAdded, t0)
			}
		})
	}
}

func TestParseTaintEffects(t *testing.T) {
	got, err := ParseTaintEffects(" XID48=NoExecute, GPULost=None ")
	if err != nil {
		t.Fatal(err)
	}
	if got["XID48"] != resourceapi.DeviceTaintEffectNoExecute || got["GPULost"] != resourceapi.DeviceTaintEffectNone {
		t.Errorf("got %v", got)
	}
	if s := FormatTaintEffects(got); s != "GPULost=None,XID48=NoExecute" {
		t.Errorf("format: %q", s)
	}
	for _, bad := range []string{"XID48", "XID48=PreferNoSchedule", "=NoSchedule"} {
		if _, err := ParseTaintEffects(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseXIDs(t *testing.T) {
	got, err := ParseXIDs("43, 13,13,,109")
	if err != nil {
		t.Fatal(err)
	}
	if s := FormatXIDs(got); s != "13,43,109" {
		t.Errorf("got %s", s)
	}
	if _, err := ParseXIDs("13,x"); err == nil {
		t.Error("no error for a non-number")
	}
}
