package v1beta1

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Validate reports every invalid field of the GpuConfig: a strategy NVIDIA's
// API does not have, and whatever this driver's own validation finds in the
// converted config (the fields have the same names, so the paths are the
// user's). That validation is stricter than NVIDIA's driver in two places,
// where NVIDIA's would apply something other than what is written
// (docs/migration.md): a defaultActiveThreadPercentage of 0, and a memory
// limit that is not a whole number of mebibytes (NVIDIA's rounds it down).
func (c *GpuConfig) Validate() field.ErrorList {
	if c == nil || c.Sharing == nil {
		return nil
	}
	return validate(c.Sharing.Strategy, c.DriverConfig().Validate())
}

// Validate reports every invalid field of the MigDeviceConfig, as
// GpuConfig.Validate does.
func (c *MigDeviceConfig) Validate() field.ErrorList {
	if c == nil || c.Sharing == nil {
		return nil
	}
	return validate(c.Sharing.Strategy, c.DriverConfig().Validate())
}

// validate checks the strategy against NVIDIA's API and keeps the converted
// config's errors about everything else.
func validate(strategy SharingStrategy, converted field.ErrorList) field.ErrorList {
	path := field.NewPath("sharing", "strategy")
	var errs field.ErrorList
	switch {
	case strategy == "":
		errs = append(errs, field.Required(path, fmt.Sprintf("must be %q or %q; leave sharing out for exclusive use", TimeSlicingStrategy, MPSStrategy)))
	case !slices.Contains(strategies, strategy):
		errs = append(errs, field.NotSupported(path, strategy, strategies))
	}
	for _, e := range converted {
		if e.Field != path.String() {
			errs = append(errs, e)
		}
	}
	return errs
}
