// Package kubectlgpu implements `kubectl gpu`, a kubectl plugin that shows
// the GPUs a DRA driver (gpu.dra.dev by default) publishes in a cluster and
// who holds them: per node, per GPU and per claim.
//
// The plugin reads four resource types, each with one (paginated) list:
// ResourceSlices, ResourceClaims, DeviceClasses and Pods. Build indexes them
// once into an Inventory; the reports (NodeList, NodeDetail, ClaimList) are
// stable structs that the table printers and -o json|yaml share.
//
// Everything is derived from the published ResourceSlices and the claims'
// allocation results, the same data the scheduler allocates from: the
// device kind comes from the type attribute, the GPU a device belongs to
// from its minor (or parentMinor) attribute, and free MIG placements from
// the GPU's counter set minus what allocated devices consume. The package
// does not import the device model (which needs NVML and cgo); the names it
// relies on are checked against pkg/devicemodel in its tests.
package kubectlgpu
