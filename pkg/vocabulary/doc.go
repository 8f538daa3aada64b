// Package vocabulary holds the names gpu.dra.dev publishes and users write:
// the driver name, the attribute, capacity and counter names of its
// ResourceSlices (what a CEL selector such as
// device.attributes["gpu.dra.dev"].productName reads), the device kinds its
// DeviceClasses select on, and how an opaque config in a claim or class is
// matched to a request.
//
// It is the one definition of these names, as
// k8s.io/dynamic-resource-allocation/deviceattribute is for the standard
// attributes, and it imports only the standard library, so that every
// binary (the controller and kubectl gpu included, which must not link NVML)
// can use it. Changing a value here changes the published API.
package vocabulary
