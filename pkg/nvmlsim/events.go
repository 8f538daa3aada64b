package nvmlsim

import (
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// noInstance is the GPU- and compute-instance ID of events not attributed to a MIG device.
const noInstance = 0xFFFFFFFF

// maxQueuedEvents bounds an event set's queue; the oldest events are dropped beyond it.
const maxQueuedEvents = 1024

// eventSet is an NVML event set. Fields are guarded by Machine.mu.
type eventSet struct {
	handle     *mock.EventSet
	queue      []nvml.EventData
	notify     chan struct{} // capacity 1: "the queue may have changed"
	registered map[int]uint64
	freed      bool
}

func (m *Machine) eventSetCreate() (nvml.EventSet, nvml.Return) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ret := m.checkInit(); ret != nvml.SUCCESS {
		return nil, ret
	}
	es := &eventSet{notify: make(chan struct{}, 1), registered: map[int]uint64{}}
	h := &mock.EventSet{}
	h.WaitFunc = func(timeoutMs uint32) (nvml.EventData, nvml.Return) { return m.wait(es, timeoutMs) }
	h.FreeFunc = func() nvml.Return {
		m.mu.Lock()
		defer m.mu.Unlock()
		es.freed = true
		delete(m.eventSets, h)
		es.wake()
		return nvml.SUCCESS
	}
	finishMock(h, "EventSet", func(method string) (nvml.Return, bool) {
		m.waitWhileHung()
		m.mu.Lock()
		defer m.mu.Unlock()
		if ret := m.checkInit(); ret != nvml.SUCCESS {
			return ret, true
		}
		if es.freed {
			return nvml.ERROR_INVALID_ARGUMENT, true
		}
		return m.consumeFault("EventSet."+method, -1)
	})
	es.handle = h
	m.eventSets[h] = es
	return h, nvml.SUCCESS
}

func (es *eventSet) wake() {
	select {
	case es.notify <- struct{}{}:
	default:
	}
}

// wait implements EventSet.Wait: the oldest queued event, or ERROR_TIMEOUT after timeoutMs.
func (m *Machine) wait(es *eventSet, timeoutMs uint32) (nvml.EventData, nvml.Return) {
	deadline := time.Now().Add(time.Duration(timeoutMs) * time.Millisecond)
	for {
		m.mu.Lock()
		if es.freed {
			m.mu.Unlock()
			return nvml.EventData{}, nvml.ERROR_INVALID_ARGUMENT
		}
		if len(es.queue) > 0 {
			ev := es.queue[0]
			es.queue = es.queue[1:]
			m.mu.Unlock()
			return ev, nvml.SUCCESS
		}
		m.mu.Unlock()
		left := time.Until(deadline)
		if left <= 0 {
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
		timer := time.NewTimer(left)
		select {
		case <-es.notify:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// supportedEvents is what GetSupportedEventTypes reports.
func (g *gpu) supportedEvents() uint64 {
	types := uint64(nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError |
		nvml.EventTypePState | nvml.EventTypeXidCriticalError | nvml.EventTypeClock |
		nvml.EventTypePowerSourceChange)
	if g.spec.mig != nil {
		types |= nvml.EventMigConfigChange
	}
	return types
}

// registerEvents implements Device.RegisterEvents.
func (g *gpu) registerEvents(types uint64, set nvml.EventSet) nvml.Return {
	if types&^g.supportedEvents() != 0 {
		return nvml.ERROR_NOT_SUPPORTED
	}
	h, ok := set.(*mock.EventSet)
	if !ok {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	m := g.m
	m.mu.Lock()
	defer m.mu.Unlock()
	es := m.eventSets[h]
	if es == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	es.registered[g.index] |= types
	return nvml.SUCCESS
}

// deliverLocked queues an event for every set registered for eventType on GPU gpuIndex. m.mu
// must be held.
func (m *Machine) deliverLocked(gpuIndex int, eventType, data uint64, gi, ci uint32) {
	for _, es := range m.eventSets {
		if es.registered[gpuIndex]&eventType == 0 {
			continue
		}
		if len(es.queue) >= maxQueuedEvents {
			es.queue = es.queue[1:]
		}
		es.queue = append(es.queue, nvml.EventData{
			Device:            m.gpus[gpuIndex].handle,
			EventType:         eventType,
			EventData:         data,
			GpuInstanceId:     gi,
			ComputeInstanceId: ci,
		})
		es.wake()
	}
}

// InjectEvent delivers an event of eventType (e.g. nvml.EventTypeXidCriticalError with the XID
// in data, nvml.EventTypeDoubleBitEccError) on GPU gpuIndex to the event sets registered for it,
// as the driver would. ECC events also raise the counters GetTotalEccErrors reports, and XIDs
// the recovery action the GPU reports (XIDRecoveryAction). An
// out-of-range gpuIndex is ignored.
func (m *Machine) InjectEvent(gpuIndex int, eventType uint64, data uint64) {
	m.injectEvent(gpuIndex, eventType, data, noInstance, noInstance)
}

// InjectMigEvent is InjectEvent for an event attributed to the MIG device of compute instance
// ciID in GPU instance giID, as NVML reports XIDs raised inside a MIG device.
func (m *Machine) InjectMigEvent(gpuIndex int, giID, ciID uint32, eventType uint64, data uint64) {
	m.injectEvent(gpuIndex, eventType, data, giID, ciID)
}

func (m *Machine) injectEvent(gpuIndex int, eventType, data uint64, gi, ci uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, err := m.gpuAt(gpuIndex)
	if err != nil {
		return
	}
	oldCorrected, oldUncorrected, oldAction := g.eccCorrected, g.eccUncorrected, g.recoveryAction
	if eventType&nvml.EventTypeXidCriticalError != 0 {
		g.raiseRecoveryActionLocked(data)
	}
	if eventType&nvml.EventTypeSingleBitEccError != 0 {
		g.eccCorrected++
	}
	if eventType&nvml.EventTypeDoubleBitEccError != 0 {
		g.eccUncorrected++
	}
	if g.eccCorrected != oldCorrected || g.eccUncorrected != oldUncorrected || g.recoveryAction != oldAction {
		// Best effort: the event is delivered even if the counters cannot be persisted.
		_ = m.commit(func() { g.eccCorrected, g.eccUncorrected, g.recoveryAction = oldCorrected, oldUncorrected, oldAction })
	}
	m.deliverLocked(gpuIndex, eventType, data, gi, ci)
}
