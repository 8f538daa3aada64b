package health

import (
	"fmt"
	"sort"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// TaintKeySuffix follows the driver name in the default taint key:
// "gpu.dra.dev/unhealthy".
const TaintKeySuffix = "/unhealthy"

// TaintPolicy says how an unhealthy device is tainted in the ResourceSlice.
type TaintPolicy struct {
	// Key is the taint key, e.g. "gpu.dra.dev/unhealthy". The value is the
	// condition's reason (GPULost, DoubleBitECC, XID48, ...), followed by
	// the pending recovery action if there is one (TaintValue).
	Key string
	// Effect applies to reasons not in Effects.
	Effect resourceapi.DeviceTaintEffect
	// Effects override Effect per taint value ("XID48-reset-required") or,
	// failing that, per reason ("XID48").
	Effects map[string]resourceapi.DeviceTaintEffect
}

// DefaultTaintPolicy taints unhealthy devices NoSchedule, and NoExecute
// when the GPU is lost or fell off the bus (XID 79): the pods using it
// cannot run anyway, and evicting them lets their controllers start them
// elsewhere.
func DefaultTaintPolicy(driverName string) TaintPolicy {
	return TaintPolicy{
		Key:    driverName + TaintKeySuffix,
		Effect: resourceapi.DeviceTaintEffectNoSchedule,
		Effects: map[string]resourceapi.DeviceTaintEffect{
			ReasonGPULost: resourceapi.DeviceTaintEffectNoExecute,
			XIDReason(79): resourceapi.DeviceTaintEffectNoExecute,
		},
	}
}

// effect returns the effect for a taint value and its reason.
func (p TaintPolicy) effect(value, reason string) resourceapi.DeviceTaintEffect {
	if e, ok := p.Effects[value]; ok {
		return e
	}
	if e, ok := p.Effects[reason]; ok {
		return e
	}
	return p.Effect
}

// TaintValue is the taint value of a condition with reason and pending
// recovery action a: the reason alone, or "<reason>-<action>-required"
// ("XID48-reset-required", "XID79-reboot-required"). Both are valid label
// values (at most 63 characters).
func TaintValue(reason string, a Action) string {
	if a == "" {
		return reason
	}
	return reason + "-" + string(a) + "-required"
}

// Taints returns the taints of a device of the GPU whose health is st: none
// while healthy, otherwise one taint with the condition's reason as value
// and its start as TimeAdded. mig is the MIG instance the device is, nil for
// whole GPUs, shares and MIG placements not instantiated.
func Taints(st Status, mig *MIGInstance, p TaintPolicy) []resourceapi.DeviceTaint {
	c := st.ConditionFor(mig)
	if c == nil {
		return nil
	}
	reason := c.Reason
	if st.Lost {
		reason = ReasonGPULost
	}
	added := metav1.NewTime(c.Since.Truncate(time.Second)) // the API keeps seconds
	value := TaintValue(reason, c.Action)
	return []resourceapi.DeviceTaint{{Key: p.Key, Value: value, Effect: p.effect(value, reason), TimeAdded: &added}}
}

// DeviceTaints is Taints for device d, looked up in snap; nil when d's GPU is
// not monitored.
func DeviceTaints(snap Snapshot, d Device, p TaintPolicy) []resourceapi.DeviceTaint {
	st, ok := snap[d.GPUUUID]
	if !ok {
		return nil
	}
	return Taints(st, d.MIG, p)
}

// ParseTaintEffects parses per-reason taint effects as a flag gives them:
// "GPULost=NoExecute,XID79=NoExecute,XID48=NoExecute". Effects are None,
// NoSchedule or NoExecute.
func ParseTaintEffects(s string) (map[string]resourceapi.DeviceTaintEffect, error) {
	out := map[string]resourceapi.DeviceTaintEffect{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		reason, effect, ok := strings.Cut(f, "=")
		if !ok || reason == "" {
			return nil, fmt.Errorf("invalid taint effect %q: want <reason>=<effect>", f)
		}
		e, err := ParseTaintEffect(effect)
		if err != nil {
			return nil, fmt.Errorf("taint effect for %s: %w", reason, err)
		}
		out[reason] = e
	}
	return out, nil
}

// ParseTaintEffect accepts None, NoSchedule and NoExecute.
func ParseTaintEffect(s string) (resourceapi.DeviceTaintEffect, error) {
	switch e := resourceapi.DeviceTaintEffect(s); e {
	case resourceapi.DeviceTaintEffectNone, resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute:
		return e, nil
	}
	return "", fmt.Errorf("invalid effect %q: want None, NoSchedule or NoExecute", s)
}

// FormatTaintEffects is the inverse of ParseTaintEffects, sorted by reason.
func FormatTaintEffects(effects map[string]resourceapi.DeviceTaintEffect) string {
	parts := make([]string, 0, len(effects))
	for r, e := range effects {
		parts = append(parts, r+"="+string(e))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// TaintResources returns a copy of res whose devices carry the taints of
// their health (per DeviceTaints), ready for kubeletplugin.Helper's
// PublishResources. Devices not listed in devices, and taints of other keys
// already on a device, are kept as they are; res is not modified.
func TaintResources(res resourceslice.DriverResources, snap Snapshot, devices []Device, p TaintPolicy) resourceslice.DriverResources {
	type key struct{ pool, name string }
	byName := make(map[key]Device, len(devices))
	for _, d := range devices {
		byName[key{d.Pool, d.Name}] = d
	}
	out := resourceslice.DriverResources{Pools: make(map[string]resourceslice.Pool, len(res.Pools))}
	for poolName, pool := range res.Pools {
		tainted := make([]resourceslice.Slice, len(pool.Slices))
		for i, s := range pool.Slices {
			s.Devices = append([]resourceapi.Device(nil), s.Devices...)
			for j := range s.Devices {
				dev := &s.Devices[j]
				d, ok := byName[key{poolName, dev.Name}]
				if !ok {
					continue
				}
				var taints []resourceapi.DeviceTaint
				for _, t := range dev.Taints {
					if t.Key != p.Key {
						taints = append(taints, t)
					}
				}
				dev.Taints = append(taints, DeviceTaints(snap, d, p)...)
			}
			tainted[i] = s
		}
		pool.Slices = tainted
		out.Pools[poolName] = pool
	}
	return out
}
