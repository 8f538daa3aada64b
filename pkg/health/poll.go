package health

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2"
)

// poll probes every GPU, then expires conditions whose window has passed.
func (m *Monitor) poll(ctx context.Context) {
	m.checkBoot(ctx)
	for _, uuid := range m.opts.GPUs {
		m.probe(ctx, uuid)
	}
	m.expire(ctx)
	if m.afterPoll != nil {
		m.afterPoll()
	}
}

// probe checks whether GPU uuid is lost, was reset since the last probe, or
// has a recovery action pending or done (observeAction).
//
// Lost: NVML answers ERROR_GPU_IS_LOST for the handle lookup or a query.
// Reset: a lost GPU answers again, or its volatile uncorrected ECC counter
// (which a GPU reset or driver reload clears) went down. On GPUs whose
// events are not supported, a rising counter is also taken as a
// double-bit ECC error.
func (m *Monitor) probe(ctx context.Context, uuid string) {
	logger := klog.FromContext(ctx)
	dev, ret := m.opts.NVML.DeviceGetHandleByUUID(uuid)
	if ret == nvml.ERROR_GPU_IS_LOST {
		m.setLost(ctx, uuid, true)
		return
	}
	if ret != nvml.SUCCESS {
		logger.V(2).Info("Cannot probe GPU", "gpu", uuid, "err", ret)
		return
	}
	count, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	if ret == nvml.ERROR_GPU_IS_LOST {
		m.setLost(ctx, uuid, true)
		return
	}
	m.setLost(ctx, uuid, false)
	if action, ok := m.recoveryAction(ctx, uuid); ok {
		m.observeAction(ctx, uuid, action)
	}
	if ret != nvml.SUCCESS {
		return // ECC disabled or not supported: nothing more to learn
	}

	m.mu.Lock()
	prev, known := m.eccUncorrected[uuid]
	m.eccUncorrected[uuid] = count
	eventsUnsupported := m.states[uuid] != nil && m.states[uuid].EventsUnsupported
	m.mu.Unlock()
	switch {
	case !known:
	case count < prev:
		m.ObserveReset(ctx, uuid, fmt.Sprintf("volatile uncorrected ECC count went from %d to %d", prev, count))
	case count > prev && eventsUnsupported:
		m.handleEvent(ctx, Event{GPUUUID: uuid, Type: EventDoubleBitECC, Time: m.clock.Now()})
	}
}
