package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1beta1 "github.com/gpu-dra/gpu-dra-driver/api/gpu/v1beta1"
)

// DriverConfig is the GpuConfig as this driver's own: the same strategy
// and settings, no sharing as Exclusive, defaulted. Which devices a
// strategy applies to is the plugin's rule for its own configs.
func (c *GpuConfig) DriverConfig() gpuv1beta1.Config {
	out := &gpuv1beta1.GpuConfig{TypeMeta: driverTypeMeta(gpuv1beta1.GpuConfigKind)}
	if s := c.Sharing; s != nil {
		out.Sharing = &gpuv1beta1.GpuSharing{
			Strategy:          gpuv1beta1.SharingStrategy(s.Strategy),
			TimeSlicingConfig: s.TimeSlicingConfig.DeepCopy(),
			MPSConfig:         s.MpsConfig.driverConfig(),
		}
	}
	out.Default()
	return out
}

// DriverConfig is the MigDeviceConfig as this driver's own.
func (c *MigDeviceConfig) DriverConfig() gpuv1beta1.Config {
	out := &gpuv1beta1.MigDeviceConfig{TypeMeta: driverTypeMeta(gpuv1beta1.MigDeviceConfigKind)}
	if s := c.Sharing; s != nil {
		out.Sharing = &gpuv1beta1.MigDeviceSharing{
			Strategy:  gpuv1beta1.SharingStrategy(s.Strategy),
			MPSConfig: s.MpsConfig.driverConfig(),
		}
	}
	out.Default()
	return out
}

func (c *MpsConfig) driverConfig() *gpuv1beta1.MPSConfig {
	if c == nil {
		return nil
	}
	c = c.DeepCopy()
	return &gpuv1beta1.MPSConfig{
		DefaultActiveThreadPercentage:     c.DefaultActiveThreadPercentage,
		DefaultPinnedDeviceMemoryLimit:    c.DefaultPinnedDeviceMemoryLimit,
		DefaultPerDevicePinnedMemoryLimit: c.DefaultPerDevicePinnedMemoryLimit,
	}
}

func driverTypeMeta(kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: gpuv1beta1.GroupVersion.String(), Kind: kind}
}
