package telemetry

import (
	"encoding/binary"
	"math"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"k8s.io/component-base/metrics"
)

// sample is one value read from a device; extra are the values of the
// reading's labels beyond deviceLabels.
type sample struct {
	desc      *metrics.Desc
	valueType metrics.ValueType
	value     float64
	extra     []string
}

// reading is one metric read from NVML.
type reading struct {
	desc      *metrics.Desc
	valueType metrics.ValueType
	read      func(r *reading, d nvml.Device) []sample
}

func (r *reading) sample(v float64, extra ...string) sample {
	return sample{desc: r.desc, valueType: r.valueType, value: v, extra: extra}
}

func newReading(name, help string, vt metrics.ValueType, extra []string, read func(r *reading, d nvml.Device) []sample) *reading {
	labels := append(append([]string{}, deviceLabels...), extra...)
	return &reading{
		desc:      metrics.NewDesc(namespace+"_"+deviceSubsystem+"_"+name, help, labels, nil, metrics.ALPHA, ""),
		valueType: vt,
		read:      read,
	}
}

// one reads a single value; ok false leaves the reading out.
func one(get func(d nvml.Device) (float64, bool)) func(r *reading, d nvml.Device) []sample {
	return func(r *reading, d nvml.Device) []sample {
		if v, ok := get(d); ok {
			return []sample{r.sample(v)}
		}
		return nil
	}
}

// readings are the device metrics; see docs/telemetry.md.
func readings() []*reading {
	gauge, counter := metrics.GaugeValue, metrics.CounterValue
	utilization := func(pick func(nvml.Utilization) uint32) func(nvml.Device) (float64, bool) {
		return func(d nvml.Device) (float64, bool) {
			u, ret := d.GetUtilizationRates()
			return float64(pick(u)) / 100, ret == nvml.SUCCESS
		}
	}
	memory := func(pick func(nvml.Memory) uint64) func(nvml.Device) (float64, bool) {
		return func(d nvml.Device) (float64, bool) {
			m, ret := d.GetMemoryInfo()
			return float64(pick(m)), ret == nvml.SUCCESS
		}
	}
	clockHz := func(t nvml.ClockType) func(nvml.Device) (float64, bool) {
		return func(d nvml.Device) (float64, bool) {
			mhz, ret := d.GetClockInfo(t)
			return float64(mhz) * 1e6, ret == nvml.SUCCESS
		}
	}
	return []*reading{
		newReading("utilization_ratio", "Fraction of the last sample period in which a kernel ran on the GPU (NVML utilization.gpu).", gauge, nil,
			one(utilization(func(u nvml.Utilization) uint32 { return u.Gpu }))),
		newReading("memory_utilization_ratio", "Fraction of the last sample period in which device memory was read or written (NVML utilization.memory).", gauge, nil,
			one(utilization(func(u nvml.Utilization) uint32 { return u.Memory }))),
		newReading("memory_used_bytes", "Device memory in use.", gauge, nil,
			one(memory(func(m nvml.Memory) uint64 { return m.Used }))),
		newReading("memory_total_bytes", "Device memory in total.", gauge, nil,
			one(memory(func(m nvml.Memory) uint64 { return m.Total }))),
		newReading("temperature_celsius", "GPU core temperature.", gauge, nil,
			one(func(d nvml.Device) (float64, bool) {
				t, ret := d.GetTemperature(nvml.TEMPERATURE_GPU)
				return float64(t), ret == nvml.SUCCESS
			})),
		newReading("power_watts", "Power drawn by the GPU board.", gauge, nil,
			one(func(d nvml.Device) (float64, bool) {
				mw, ret := d.GetPowerUsage()
				return float64(mw) / 1000, ret == nvml.SUCCESS
			})),
		newReading("power_limit_watts", "Power limit the driver enforces on the GPU.", gauge, nil,
			one(func(d nvml.Device) (float64, bool) {
				mw, ret := d.GetEnforcedPowerLimit()
				return float64(mw) / 1000, ret == nvml.SUCCESS
			})),
		newReading("energy_joules_total", "Energy consumed by the GPU since the driver was loaded.", counter, nil,
			one(func(d nvml.Device) (float64, bool) {
				mj, ret := d.GetTotalEnergyConsumption()
				return float64(mj) / 1000, ret == nvml.SUCCESS
			})),
		newReading("sm_clock_hertz", "Current SM clock.", gauge, nil, one(clockHz(nvml.CLOCK_SM))),
		newReading("memory_clock_hertz", "Current memory clock.", gauge, nil, one(clockHz(nvml.CLOCK_MEM))),
		newReading("ecc_volatile_errors_total", "ECC errors since the driver was loaded (or the GPU reset), by error_type (corrected, uncorrected).", counter,
			[]string{"error_type"}, eccErrors(nvml.VOLATILE_ECC)),
		newReading("ecc_aggregate_errors_total", "ECC errors over the GPU's lifetime, by error_type (corrected, uncorrected).", counter,
			[]string{"error_type"}, eccErrors(nvml.AGGREGATE_ECC)),
		newReading("nvlink_transmit_bytes_total", "Data sent over all NVLinks of the GPU (payload, without protocol overhead).", counter, nil,
			one(nvlinkBytes(nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX))),
		newReading("nvlink_receive_bytes_total", "Data received over all NVLinks of the GPU (payload, without protocol overhead).", counter, nil,
			one(nvlinkBytes(nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX))),
	}
}

func eccErrors(counter nvml.EccCounterType) func(r *reading, d nvml.Device) []sample {
	return func(r *reading, d nvml.Device) []sample {
		var out []sample
		for _, t := range []struct {
			typ  nvml.MemoryErrorType
			name string
		}{{nvml.MEMORY_ERROR_TYPE_CORRECTED, "corrected"}, {nvml.MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected"}} {
			n, ret := d.GetTotalEccErrors(t.typ, counter)
			if ret == nvml.SUCCESS {
				out = append(out, r.sample(float64(n), t.name))
			}
		}
		return out
	}
}

// allLinks is the field-value scope that sums a counter over all NVLinks.
const allLinks = math.MaxUint32

// nvlinkBytes reads an NVLink throughput field (KiB, summed over links).
func nvlinkBytes(field uint32) func(nvml.Device) (float64, bool) {
	return func(d nvml.Device) (float64, bool) {
		values := []nvml.FieldValue{{FieldId: field, ScopeId: allLinks}}
		if ret := d.GetFieldValues(values); ret != nvml.SUCCESS {
			return 0, false
		}
		kib, ok := fieldValue(values[0])
		return kib * 1024, ok
	}
}

// fieldValue decodes a field value NVML filled in.
func fieldValue(v nvml.FieldValue) (float64, bool) {
	if nvml.Return(v.NvmlReturn) != nvml.SUCCESS {
		return 0, false
	}
	b := v.Value[:]
	switch nvml.ValueType(v.ValueType) {
	case nvml.VALUE_TYPE_DOUBLE:
		return math.Float64frombits(binary.NativeEndian.Uint64(b)), true
	case nvml.VALUE_TYPE_UNSIGNED_INT:
		return float64(binary.NativeEndian.Uint32(b)), true
	case nvml.VALUE_TYPE_UNSIGNED_LONG, nvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		return float64(binary.NativeEndian.Uint64(b)), true
	case nvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return float64(int64(binary.NativeEndian.Uint64(b))), true
	case nvml.VALUE_TYPE_SIGNED_INT:
		return float64(int32(binary.NativeEndian.Uint32(b))), true
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return float64(binary.NativeEndian.Uint16(b)), true
	}
	return 0, false
}
