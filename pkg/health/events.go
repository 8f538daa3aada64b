package health

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/klog/v2"
)

// watchedEvents are the NVML event types the monitor registers for, as far
// as a GPU supports them.
const watchedEvents = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)

// errEventsUnsupported: the GPU cannot deliver the watched events.
var errEventsUnsupported = errors.New("NVML events not supported")

// watch runs the event loop of GPU uuid until ctx is canceled: one event set
// for this GPU only, so that a GPU falling off the bus cannot disturb the
// others' event delivery. The set is (re)created when the GPU is reachable.
// set and err are the result of the first registration.
func (m *Monitor) watch(ctx context.Context, uuid string, set nvml.EventSet, err error) {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "gpu", uuid)
	ctx = klog.NewContext(ctx, logger)
	free := func() {
		if set != nil {
			if ret := set.Free(); ret != nvml.SUCCESS && ret != nvml.ERROR_UNINITIALIZED {
				logger.V(2).Info("Free NVML event set", "err", ret)
			}
			set = nil
		}
	}
	defer free()
	timeoutMs := uint32(m.opts.EventTimeout.Milliseconds())
	for ctx.Err() == nil {
		if set == nil {
			if err == nil {
				set, err = m.register(ctx, uuid)
			}
			switch {
			case errors.Is(err, errEventsUnsupported):
				logger.Info("GPU cannot deliver NVML events; only a lost GPU will be detected", "err", err)
				m.update(ctx, uuid, func(s *Status) bool {
					changed := !s.EventsUnsupported
					s.EventsUnsupported = true
					return changed
				})
				return
			case err != nil:
				logger.V(2).Info("Cannot register for NVML events yet, retrying", "err", err, "in", m.opts.PollInterval)
				select {
				case <-ctx.Done():
				case <-m.clock.After(m.opts.PollInterval):
				}
				err = nil
				continue
			}
		}
		data, ret := set.Wait(timeoutMs)
		switch ret {
		case nvml.SUCCESS:
			m.handleEvent(ctx, m.toEvent(uuid, data))
		case nvml.ERROR_TIMEOUT:
		case nvml.ERROR_GPU_IS_LOST:
			m.setLost(ctx, uuid, true)
			free() // registered again once the GPU is back
		case nvml.ERROR_UNINITIALIZED:
			logger.Info("NVML shut down, stopping event monitoring")
			set = nil // freed with the library
			return
		default:
			logger.Error(fmt.Errorf("wait for NVML events: %w", ret), "Event wait failed, registering again", "in", m.opts.PollInterval)
			free()
			select {
			case <-ctx.Done():
			case <-m.clock.After(m.opts.PollInterval):
			}
		}
	}
}

// register creates an event set for GPU uuid's critical events.
func (m *Monitor) register(ctx context.Context, uuid string) (nvml.EventSet, error) {
	dev, ret := m.opts.NVML.DeviceGetHandleByUUID(uuid)
	if ret == nvml.ERROR_GPU_IS_LOST {
		m.setLost(ctx, uuid, true)
	}
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get handle of %s: %w", uuid, ret)
	}
	supported, ret := dev.GetSupportedEventTypes()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return nil, fmt.Errorf("%w: %v", errEventsUnsupported, ret)
	}
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("get supported event types of %s: %w", uuid, ret)
	}
	mask := watchedEvents & supported
	if mask == 0 {
		return nil, fmt.Errorf("%w: the GPU supports event types %#x, none of XID and double-bit ECC", errEventsUnsupported, supported)
	}
	set, ret := m.opts.NVML.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("create NVML event set: %w", ret)
	}
	ret = dev.RegisterEvents(mask, set)
	if ret != nvml.SUCCESS {
		_ = set.Free()
		if ret == nvml.ERROR_NOT_SUPPORTED {
			return nil, fmt.Errorf("%w: register events on %s: %v", errEventsUnsupported, uuid, ret)
		}
		return nil, fmt.Errorf("register events on %s: %w", uuid, ret)
	}
	klog.FromContext(ctx).V(4).Info("Registered for NVML events", "types", fmt.Sprintf("%#x", mask))
	return set, nil
}

// toEvent converts NVML event data from GPU uuid's event set.
func (m *Monitor) toEvent(uuid string, data nvml.EventData) Event {
	e := Event{GPUUUID: uuid, Type: EventXID, XID: data.EventData, Time: m.clock.Now()}
	if data.EventType&nvml.EventTypeDoubleBitEccError != 0 {
		e.Type, e.XID = EventDoubleBitECC, 0
	}
	if data.GpuInstanceId != noInstance {
		e.MIG = &MIGInstance{GPUInstance: data.GpuInstanceId, ComputeInstance: data.ComputeInstanceId}
	}
	if e.Type == EventDoubleBitECC {
		e.MIG = nil // memory errors concern the whole GPU
	}
	return e
}
