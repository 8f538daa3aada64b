package v1beta1

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Bounds of an MPS pinned device memory limit. MPS takes the limit in whole
// megabytes, so less than 1Mi cannot be expressed; more than 1Ti exceeds the
// memory of any GPU and is taken for a typo (80Ti for 80Gi).
var (
	minPinnedDeviceMemoryLimit = resource.MustParse("1Mi")
	maxPinnedDeviceMemoryLimit = resource.MustParse("1Ti")
)

// maxDevicesPerConfig bounds the number of per-device entries: a claim's
// allocation holds at most this many devices.
const maxDevicesPerConfig = resourceapi.AllocationResultsMaxSize

// mpsDeviceOrdinal is the only device index a per-device limit may have: a
// claim's containers reach one MPS device (the plugin refuses a claim with
// more), and CUDA numbers the one device a client sees through its MPS
// server 0, the ordinal CUDA_MPS_PINNED_DEVICE_MEM_LIMIT is keyed by.
const mpsDeviceOrdinal = "0"

// pinnedMemoryUnit is the unit MPS takes pinned memory limits in (the "M"
// of set_default_device_pinned_mem_limit and
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, 2^20 bytes); a limit that is not a
// multiple of it could not be applied as written.
const pinnedMemoryUnit = 1 << 20

var (
	indexKey = regexp.MustCompile(`^(0|[1-9][0-9]*)$`)
	gpuUUID  = regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	migUUID  = regexp.MustCompile(`^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// deviceKind says which UUIDs may key per-device MPS limits.
type deviceKind struct {
	uuid *regexp.Regexp
	what string // used in messages: "a GPU UUID (GPU-…)"
}

var (
	gpuDevices = deviceKind{uuid: gpuUUID, what: "a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"}
	migDevices = deviceKind{uuid: migUUID, what: "a MIG device UUID (MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"}
)

// Validate reports every invalid field of the GpuConfig. It accepts a config
// before and after Default; it does not look at TypeMeta, which Decode
// checks.
func (c *GpuConfig) Validate() field.ErrorList {
	if c == nil {
		return nil
	}
	return c.Sharing.validate(field.NewPath("sharing"))
}

// Validate reports every invalid field of the MigDeviceConfig. It accepts a
// config before and after Default; it does not look at TypeMeta, which
// Decode checks.
func (c *MigDeviceConfig) Validate() field.ErrorList {
	if c == nil {
		return nil
	}
	return c.Sharing.validate(field.NewPath("sharing"))
}

func (s *GpuSharing) validate(path *field.Path) field.ErrorList {
	if s == nil {
		return nil
	}
	errs := validateStrategy(s.Strategy, gpuSharingStrategies, path.Child("strategy"))
	known := len(errs) == 0
	if s.TimeSlicingConfig != nil {
		p := path.Child("timeSlicingConfig")
		if known && s.Strategy != TimeSlicingStrategy {
			errs = append(errs, subConfigForbidden(p, TimeSlicingStrategy, s.Strategy))
		} else {
			errs = append(errs, s.TimeSlicingConfig.validate(p)...)
		}
	}
	if s.MPSConfig != nil {
		p := path.Child("mpsConfig")
		if known && s.Strategy != MPSStrategy {
			errs = append(errs, subConfigForbidden(p, MPSStrategy, s.Strategy))
		} else {
			errs = append(errs, s.MPSConfig.validate(p, gpuDevices)...)
		}
	}
	return errs
}

func (s *MigDeviceSharing) validate(path *field.Path) field.ErrorList {
	if s == nil {
		return nil
	}
	errs := validateStrategy(s.Strategy, migDeviceSharingStrategies, path.Child("strategy"))
	known := len(errs) == 0
	if s.MPSConfig != nil {
		p := path.Child("mpsConfig")
		if known && s.Strategy != MPSStrategy {
			errs = append(errs, subConfigForbidden(p, MPSStrategy, s.Strategy))
		} else {
			errs = append(errs, s.MPSConfig.validate(p, migDevices)...)
		}
	}
	return errs
}

func validateStrategy(s SharingStrategy, supported []SharingStrategy, path *field.Path) field.ErrorList {
	switch {
	case s == "":
		return field.ErrorList{field.Required(path,
			fmt.Sprintf("must be one of %s; leave sharing out for Exclusive", quoted(supported)))}
	case !slices.Contains(supported, s):
		return field.ErrorList{field.NotSupported(path, s, supported)}
	}
	return nil
}

func subConfigForbidden(path *field.Path, owner, actual SharingStrategy) *field.Error {
	return field.Forbidden(path, fmt.Sprintf("may only be set when strategy is %q, not %q", owner, actual))
}

func (c *TimeSlicingConfig) validate(path *field.Path) field.ErrorList {
	if c == nil || c.Interval == nil {
		return nil
	}
	if !slices.Contains(timeSliceIntervals, *c.Interval) {
		return field.ErrorList{field.NotSupported(path.Child("interval"), *c.Interval, timeSliceIntervals)}
	}
	return nil
}

func (c *MPSConfig) validate(path *field.Path, devices deviceKind) field.ErrorList {
	if c == nil {
		return nil
	}
	var errs field.ErrorList
	if p := c.DefaultActiveThreadPercentage; p != nil && (*p < 1 || *p > 100) {
		errs = append(errs, field.Invalid(path.Child("defaultActiveThreadPercentage"), *p,
			"must be a percentage of the device's threads from 1 to 100"))
	}
	if q := c.DefaultPinnedDeviceMemoryLimit; q != nil {
		errs = append(errs, validatePinnedLimit(*q, path.Child("defaultPinnedDeviceMemoryLimit"))...)
	}
	if m := c.DefaultPerDevicePinnedMemoryLimit; m != nil {
		p := path.Child("defaultPerDevicePinnedMemoryLimit")
		if len(m) > maxDevicesPerConfig {
			errs = append(errs, field.TooMany(p, len(m), maxDevicesPerConfig))
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			errs = append(errs, validateDeviceKey(k, p.Key(k), devices)...)
			errs = append(errs, validatePinnedLimit(m[k], p.Key(k))...)
		}
	}
	if pr := c.ClientPriority; pr != nil && !slices.Contains(mpsClientPriorities, *pr) {
		errs = append(errs, field.NotSupported(path.Child("clientPriority"), *pr, mpsClientPriorities))
	}
	return errs
}

func validatePinnedLimit(q resource.Quantity, path *field.Path) field.ErrorList {
	var detail string
	switch {
	case q.Sign() < 0:
		detail = "must not be negative"
	case q.Sign() == 0:
		detail = "must be greater than zero; leave the limit out to derive it from the claim's capacity"
	case tooSmall(q):
		detail = "must be at least 1Mi: MPS counts pinned device memory in whole megabytes"
	case tooLarge(q):
		detail = "must be at most 1Ti, more than the memory of any GPU"
	default:
		// Between 1Mi and 1Ti, so Cmp is quick: Value is exact or rounds
		// a fraction of a byte up.
		bytes := q.Value()
		if bytes%pinnedMemoryUnit == 0 && resource.NewQuantity(bytes, resource.BinarySI).Cmp(q) == 0 {
			return nil
		}
		down, up := bytes/pinnedMemoryUnit, (bytes+pinnedMemoryUnit-1)/pinnedMemoryUnit
		detail = fmt.Sprintf("must be a whole number of mebibytes (a multiple of 1Mi), the unit MPS takes it in, "+
			"so that it is applied as written: use %dMi or %dMi", down, up)
	}
	return field.ErrorList{field.Invalid(path, q.String(), detail)}
}

// tooSmall reports whether a positive q is below 1Mi. It settles clear
// cases by magnitude, so that Cmp, slow for extreme exponents, only ever
// compares quantities of similar size.
func tooSmall(q resource.Quantity) bool {
	lo, hi := log10Bounds(q)
	switch {
	case hi <= 6: // below 1e6 < 1Mi
		return true
	case lo >= 7: // at least 1e7 > 1Mi
		return false
	}
	return q.Cmp(minPinnedDeviceMemoryLimit) < 0
}

// tooLarge reports whether a positive q is above 1Ti, like tooSmall.
func tooLarge(q resource.Quantity) bool {
	lo, hi := log10Bounds(q)
	switch {
	case lo >= 13: // at least 1e13 > 1Ti
		return true
	case hi <= 12: // below 1e12 < 1Ti
		return false
	}
	return q.Cmp(maxPinnedDeviceMemoryLimit) > 0
}

func validateDeviceKey(key string, path *field.Path, devices deviceKind) field.ErrorList {
	if devices.uuid.MatchString(key) {
		return nil
	}
	if key == mpsDeviceOrdinal {
		return nil
	}
	if indexKey.MatchString(key) {
		return field.ErrorList{field.Invalid(path, key,
			"device index must be 0: a claim's containers reach one MPS device, which CUDA numbers 0; "+
				"name other devices by UUID")}
	}
	return field.ErrorList{field.Invalid(path, key,
		fmt.Sprintf("key must be %s in lowercase as nvidia-smi -L prints it, or the device index 0",
			devices.what))}
}

// quoted renders values as `"A", "B", "C"` for messages.
func quoted[T ~string](values []T) string {
	s := ""
	for i, v := range values {
		if i > 0 {
			s += ", "
		}
		s += strconv.Quote(string(v))
	}
	return s
}
