// Package devicemodel turns discovered GPUs into the DRA devices and
// ResourceSlices the scheduler allocates from: names, attributes, capacity
// and slice layout within the API's limits. The published names themselves
// are pkg/vocabulary's.
package devicemodel

import (
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/gpu-dra/gpu-dra-driver/pkg/vocabulary"
)

func kindAttr(k vocabulary.Kind) resourceapi.DeviceAttribute { return stringAttr(string(k)) }

func stringAttr(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: ptr.To(s)}
}

func intAttr(i int) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(i))}
}

func boolAttr(b bool) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{BoolValue: ptr.To(b)}
}

// versionAttr publishes a dotted version as a semantic version so CEL can
// compare it (device.attributes[...].driverVersion.isGreaterThan(...)).
// NVIDIA versions are padded to three parts and lose leading zeros
// ("535.104.05" → "535.104.5"), which semver forbids; an unparsable version
// falls back to a string so nothing is silently dropped.
func versionAttr(v string) resourceapi.DeviceAttribute {
	parts := strings.Split(v, ".")
	if len(parts) == 0 || len(parts) > 3 {
		return stringAttr(v)
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return stringAttr(v)
		}
		parts[i] = strconv.FormatUint(n, 10)
	}
	return resourceapi.DeviceAttribute{VersionValue: ptr.To(strings.Join(parts, "."))}
}

func bytesCapacity(b uint64) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(b), resource.BinarySI)}
}

func countCapacity(n int) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(n), resource.DecimalSI)}
}
