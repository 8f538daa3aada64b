// Package health watches the node's GPUs for hardware faults through NVML and
// keeps a health state per physical GPU: critical XID errors, double-bit ECC
// errors and GPUs that fell off the bus make a GPU (or one MIG instance of
// it) unhealthy; a quiet window or an observed GPU reset makes it healthy
// again. The state is persisted, so a plugin restart keeps unhealthy GPUs
// out of use.
//
// The Monitor produces the state; pure helpers turn it into what the DRA
// driver publishes: device taints for the ResourceSlice (Taints,
// DeviceTaints) and reports for the kubelet's health stream (Report,
// Monitor.WatchHealthStatus). See docs/health.md.
package health

import (
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Reasons of an unhealthy condition. They are valid label values, so they
// can serve as taint values.
const (
	// ReasonGPULost: NVML reports the GPU lost (fallen off the bus).
	ReasonGPULost = "GPULost"
	// ReasonDoubleBitECC: an uncorrectable (double-bit) ECC error event.
	ReasonDoubleBitECC = "DoubleBitECC"
)

// XIDReason is the reason of a condition raised by XID n, e.g. "XID79".
func XIDReason(n uint64) string { return "XID" + strconv.FormatUint(n, 10) }

// MIGInstance identifies a MIG device of a GPU by its NVML GPU-instance and
// compute-instance IDs.
type MIGInstance struct {
	GPUInstance     uint32 `json:"gi"`
	ComputeInstance uint32 `json:"ci"`
}

// noInstance is NVML's GPU- and compute-instance ID of an event that is not
// attributed to a MIG device.
const noInstance = 0xFFFFFFFF

// matches reports whether a condition recorded for instance c (possibly with
// only the GPU instance known) applies to MIG device d.
func (c MIGInstance) matches(d MIGInstance) bool {
	return c.GPUInstance == d.GPUInstance && (c.ComputeInstance == noInstance || c.ComputeInstance == d.ComputeInstance)
}

// String formats the instance as "GI 3/CI 0", or "GI 3" without a compute instance.
func (c MIGInstance) String() string {
	if c.ComputeInstance == noInstance {
		return fmt.Sprintf("GI %d", c.GPUInstance)
	}
	return fmt.Sprintf("GI %d/CI %d", c.GPUInstance, c.ComputeInstance)
}

// Condition describes why a GPU or MIG instance is unhealthy.
type Condition struct {
	// Reason is the first critical event of this episode: ReasonGPULost,
	// ReasonDoubleBitECC or XIDReason(n). A lost GPU is always ReasonGPULost.
	Reason string `json:"reason"`
	// Message is a human-readable description of the first event.
	Message string `json:"message"`
	// Since is when the GPU became unhealthy.
	Since time.Time `json:"since"`
	// LastEvent is the most recent critical event; the recovery window
	// counts from it.
	LastEvent time.Time `json:"lastEvent"`
	// Events counts the critical events of this episode.
	Events int `json:"events"`
	// Action is the recovery action NVML reports pending for the GPU (empty:
	// none, or not reported). While set, the condition does not expire: it
	// ends when the action is seen done (a reset, or for ActionReboot a new
	// boot). Only whole-GPU conditions have one.
	Action Action `json:"action,omitempty"`
}

// MIGCondition is a condition that affects one MIG instance only.
type MIGCondition struct {
	MIGInstance
	Condition
}

// Status is the health of one physical GPU.
type Status struct {
	// UUID is the GPU's UUID.
	UUID string `json:"uuid"`
	// Unhealthy is the condition affecting the whole GPU (and so every
	// device carved from it); nil while the GPU as a whole is healthy.
	Unhealthy *Condition `json:"unhealthy,omitempty"`
	// Lost is set while NVML reports the GPU lost. A lost GPU only
	// recovers when NVML reaches it again, which needs a reset or reboot.
	Lost bool `json:"lost,omitempty"`
	// MIG are conditions of single MIG instances, raised by errors NVML
	// attributes to one instance.
	MIG []MIGCondition `json:"mig,omitempty"`
	// EventsUnsupported is set when NVML cannot deliver events for the GPU;
	// then only a lost GPU is detected (by polling). Not persisted.
	EventsUnsupported bool `json:"-"`
}

// Healthy reports whether neither the GPU nor any of its MIG instances has a
// condition.
func (s Status) Healthy() bool { return s.Unhealthy == nil && len(s.MIG) == 0 }

// ConditionFor returns the condition affecting a device of the GPU: the
// GPU-wide one if any, else, for a device that is MIG instance mig, that
// instance's. Nil means healthy.
func (s Status) ConditionFor(mig *MIGInstance) *Condition {
	if s.Unhealthy != nil {
		return s.Unhealthy
	}
	if mig == nil {
		return nil
	}
	for i := range s.MIG {
		if s.MIG[i].matches(*mig) {
			return &s.MIG[i].Condition
		}
	}
	return nil
}

// clone returns a deep copy.
func (s Status) clone() Status {
	if s.Unhealthy != nil {
		c := *s.Unhealthy
		s.Unhealthy = &c
	}
	s.MIG = slices.Clone(s.MIG)
	return s
}

// Snapshot is the health of every monitored GPU, by GPU UUID.
type Snapshot map[string]Status

// EventType says what a health event is.
type EventType string

// Event types.
const (
	EventXID          EventType = "xid"
	EventDoubleBitECC EventType = "dbe"
	EventGPULost      EventType = "gpu_lost"
)

// Event is one health event seen on a GPU, critical or ignored.
type Event struct {
	GPUUUID string
	Type    EventType
	// XID is the XID number of an EventXID.
	XID uint64
	// MIG is the MIG instance the event is attributed to; nil when it
	// concerns the whole GPU.
	MIG *MIGInstance
	// Ignored is set for XIDs configured as ignored; they change nothing.
	Ignored bool
	Time    time.Time
}

// reason returns the condition reason and message of a critical event.
func (e Event) reason() (string, string) {
	var reason, msg string
	switch e.Type {
	case EventGPULost:
		reason, msg = ReasonGPULost, "NVML reports the GPU lost (fallen off the bus)"
	case EventDoubleBitECC:
		reason, msg = ReasonDoubleBitECC, "uncorrectable (double-bit) ECC error"
	default:
		reason, msg = XIDReason(e.XID), "XID "+strconv.FormatUint(e.XID, 10)
		if d := xidDescription(e.XID); d != "" {
			msg += " (" + d + ")"
		}
	}
	if e.MIG != nil {
		msg += " in MIG instance " + e.MIG.String()
	}
	return reason, msg
}

// raise records a critical event on condition *c, starting an episode if
// there is none.
func raise(c **Condition, reason, msg string, now time.Time) {
	if *c == nil {
		*c = &Condition{Reason: reason, Message: msg, Since: now}
	}
	(*c).LastEvent = now
	(*c).Events++
}

// apply records a critical event (not an ignored one) at now.
func (s *Status) apply(e Event, now time.Time) {
	reason, msg := e.reason()
	if e.MIG == nil {
		raise(&s.Unhealthy, reason, msg, now)
		return
	}
	for i := range s.MIG {
		if s.MIG[i].MIGInstance == *e.MIG {
			c := &s.MIG[i].Condition
			raise(&c, reason, msg, now)
			return
		}
	}
	var c *Condition
	raise(&c, reason, msg, now)
	s.MIG = append(s.MIG, MIGCondition{MIGInstance: *e.MIG, Condition: *c})
}

// setLost marks the GPU lost at now; a lost GPU's condition says so even if
// it was unhealthy for another reason before. It reports whether anything
// changed.
func (s *Status) setLost(now time.Time) bool {
	if s.Lost {
		return false
	}
	s.Lost = true
	_, msg := Event{Type: EventGPULost}.reason()
	if s.Unhealthy == nil {
		raise(&s.Unhealthy, ReasonGPULost, msg, now)
		return true
	}
	s.Unhealthy.Reason, s.Unhealthy.Message = ReasonGPULost, msg+"; before: "+s.Unhealthy.Message
	s.Unhealthy.LastEvent = now
	s.Unhealthy.Events++
	return true
}

// clear makes the GPU healthy: a reset was observed, or, with reboot, a new
// boot. A reset leaves a condition whose pending action needs a reboot (the
// GPU no longer counts as lost, though). It reports whether anything changed.
func (s *Status) clear(reboot bool) bool {
	changed := !s.Healthy() || s.Lost
	if !reboot && s.Unhealthy != nil && s.Unhealthy.Action.needsReboot() {
		changed = s.Lost || len(s.MIG) > 0
		s.Lost, s.MIG = false, nil
		return changed
	}
	s.Unhealthy, s.Lost, s.MIG = nil, false, nil
	return changed
}

// expire drops conditions whose last event is at least window before now.
// A lost GPU, and one with a pending recovery action, never expires. window <= 0 disables expiry. It reports whether
// anything changed.
func (s *Status) expire(now time.Time, window time.Duration) bool {
	if window <= 0 {
		return false
	}
	quiet := func(c *Condition) bool { return !now.Before(c.LastEvent.Add(window)) }
	changed := false
	if s.Unhealthy != nil && !s.Lost && s.Unhealthy.Action == "" && quiet(s.Unhealthy) {
		s.Unhealthy, changed = nil, true
	}
	kept := s.MIG[:0]
	for _, mc := range s.MIG {
		if quiet(&mc.Condition) {
			changed = true
			continue
		}
		kept = append(kept, mc)
	}
	s.MIG = kept
	if len(s.MIG) == 0 {
		s.MIG = nil
	}
	return changed
}
