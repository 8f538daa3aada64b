// Package kubectlgpu implements `kubectl gpu`, a kubectl plugin that shows
// the GPUs a DRA driver (gpu.dra.dev by default) publishes in a cluster and
// who holds them: per node, per GPU and per claim.
//
// The plugin reads four resource types, each with one (paginated) list:
// ResourceClaims, ResourceSlices, DeviceClasses and Pods. Load builds an
// Inventory as the slice pages arrive, keeping what the reports need rather
// than the API objects (Fetch and Build do the same from objects in
// memory). The reports (NodeList, NodeDetail, ClaimList) are stable structs
// that the table printers and -o json|yaml share; RunNodes, RunNode and
// RunClaims are the commands, and package cli their command line.
//
// Everything is derived from the published ResourceSlices and the claims'
// allocation results, the data the scheduler allocates from: the device
// kind comes from the type attribute, the GPU a device belongs to from its
// minor (or parentMinor) attribute, and free MIG placements from the GPU's
// counter set minus what allocated devices consume. The package does not
// import the device model (which needs NVML and cgo): the names it reads
// are pkg/vocabulary's, the ones the device model publishes.
package kubectlgpu
