// Package coexistence keeps the kubelet plugin from publishing devices on a
// node where NVIDIA's device plugin also hands out its GPUs. The kubelet
// reports a device plugin's resources in the Node's allocatable, which DRA
// extended resources never appear in, and the scheduler gives a node's
// nvidia.com/gpu to the device plugin whenever allocatable has it; so the
// package reads its Node, and while allocatable has nvidia.com/gpu,
// nvidia.com/gpu.<suffix> or nvidia.com/mig-<profile> it withdraws the
// node's ResourceSlices, records an event on the Node and logs the fix
// (docs/migration.md). When the device plugin is gone it publishes again.
//
// NVIDIA's DRA driver's kubelet plugin is treated the same: while
// ResourceSlices of the driver gpu.nvidia.com on the node exist that this
// plugin did not write (draslices.go tells them apart by field manager,
// also when this plugin runs under that driver name), it publishes nothing.
package coexistence
