// Package nodeoutage taints the devices of nodes whose kubelet plugin is
// registered but does not serve. The kubelet deletes a node's
// ResourceSlices only when its plugin unregisters; a plugin that hangs (a
// stuck NVML call, a deadlock, a stopped process) keeps them, and the
// scheduler keeps sending pods that then hang in ContainerCreating. Each
// plugin renews a heartbeat Lease only while its serving path answers
// (pkg/heartbeat); when a Lease has not been renewed for the grace period,
// this controller creates a DeviceTaintRule (NoSchedule; optionally
// NoExecute after a longer period) for the node's pool, and deletes it when
// renewals resume.
//
// Lapses are measured on the controller's clock, from when it last saw
// renewTime change, not by comparing renewTime with its own clock, so clock
// skew between nodes and the controller does not taint anything (the node
// lifecycle controller does the same with node Leases). It also owns the
// clean-up: a deleted node's rule and Lease are deleted, and so are those of
// a node whose Lease lapsed and whose slices are gone (the plugin was
// removed from the node; the kubelet already deleted its slices).
//
// Its state is in the API, not in memory: each rule records the Lease
// renewal it was made for, so a restarted or newly elected controller keeps
// the rule until the Lease shows another renewal. And it judges the nodes
// together too: when the share of lapsed nodes reaches a threshold (a mass
// lapse, more likely the API server's or its own fault than every
// plugin's), it stops escalating to NoExecute, as the node lifecycle
// controller does for an unhealthy zone.
//
// DeviceTaintRule is resource.k8s.io/v1 from Kubernetes 1.37 (feature
// DRADeviceTaintRules, on by default). Where the API server does not serve
// it, the controller says so, reports it in a metric and keeps asking
// discovery; the other controllers are not affected.
package nodeoutage
