package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ComputeDomainKind is the kind of ComputeDomain.
const ComputeDomainKind = "ComputeDomain"

// ComputeDomainResource is the resource of ComputeDomains, for dynamic
// clients and informers.
var ComputeDomainResource = GroupVersion.WithResource("computedomains")

// ComputeDomain is a multi-node NVLink (IMEX) domain: the pods of one job
// spread over several trays of an NVLink rack (GB200 NVL72) that share GPU
// memory across nodes. A job creates it beside its pods. The driver's
// controller reserves a channel number for the domain (status.channel) and
// creates either its shared channel claim (spec.channel.resourceClaimName)
// or its claim template (spec.channel.resourceClaimTemplateName); the pods
// that belong to the domain are those that reference it. Every claim of the
// domain is that channel number from one NVLink clique's pool, which
// restricts its pod to the nodes of that clique; no other live domain has
// the same number. The nodes
// of the domain are the nodes those pods land on: there is no node count to
// decide up front. On each node with a pod of the domain the driver
// runs the domain's IMEX daemon, with the other nodes as its peers, from the
// first of the domain's claims prepared there until the last is unprepared.
//
// Unlike the opaque configs of this package, a ComputeDomain is an API object
// (a custom resource, deployments/helm/gpu-dra-driver/crds); Decode does not
// take it.
//
// Example:
//
//	apiVersion: gpu.dra.dev/v1beta1
//	kind: ComputeDomain
//	metadata:
//	  name: training
//	spec:
//	  channel:
//	    resourceClaimName: training-channel
//	  lifetime:
//	    policy: AfterLastPod
//	    gracePeriodSeconds: 60
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ComputeDomain struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec ComputeDomainSpec `json:"spec"`
	// +optional
	Status ComputeDomainStatus `json:"status,omitempty"`
}

// ComputeDomainList is a list of ComputeDomains.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
type ComputeDomainList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []ComputeDomain `json:"items"`
}

// ComputeDomainSpec is what the job asks for. It is immutable once created
// (the CRD says so): a running domain's daemons and channels follow it.
type ComputeDomainSpec struct {
	// Channel is the IMEX channel every pod of the domain gets, and through
	// its claim which pods belong to the domain.
	Channel ComputeDomainChannel `json:"channel"`
	// Lifetime says when the domain ends. Unset means WithOwner.
	// +optional
	Lifetime *ComputeDomainLifetime `json:"lifetime,omitempty"`
}

// ComputeDomainChannel describes the channel claims of a domain: exactly
// one of ResourceClaimName and ResourceClaimTemplateName is set.
type ComputeDomainChannel struct {
	// ResourceClaimName names the ResourceClaim, in the domain's namespace,
	// that the driver's controller creates for the domain's channel (with a
	// ComputeDomainChannelConfig naming the domain); a pod belongs to the
	// domain when it references the claim (resourceClaimName). A shared
	// claim: its single allocation puts every pod of the domain into one
	// NVLink clique. Under Volcano a gang of pods sharing one claim is
	// never placed (docs/compute-domains.md, "Scheduling"); use
	// ResourceClaimTemplateName there. A DNS subdomain name.
	// +optional
	ResourceClaimName string `json:"resourceClaimName,omitempty"`
	// ResourceClaimTemplateName names the ResourceClaimTemplate, in the
	// domain's namespace, that the driver's controller creates for the
	// domain: each pod that references it (resourceClaimTemplateName) gets
	// its own claim of the domain's channel number (status.channel) in
	// its clique's pool, and belongs to the domain. NVIDIA's layout. A DNS
	// subdomain name.
	// +optional
	ResourceClaimTemplateName string `json:"resourceClaimTemplateName,omitempty"`
	// AllocationMode says which channels a pod gets. Single (the default):
	// its domain's one channel. NVIDIA's All (every channel of the
	// node) is not offered: it lets a pod into other domains' channels.
	// +optional
	AllocationMode ChannelAllocationMode `json:"allocationMode,omitempty"`
}

// ChannelAllocationMode is a ComputeDomainChannel's allocation mode.
type ChannelAllocationMode string

// SingleChannel is the one allocation mode: each pod gets its domain's
// channel.
const SingleChannel ChannelAllocationMode = "Single"

var channelAllocationModes = []ChannelAllocationMode{SingleChannel}

// ComputeDomainLifetime says when a domain ends.
type ComputeDomainLifetime struct {
	// Policy is WithOwner (the default: the domain lives until it is
	// deleted, normally with the Job that owns it through an
	// ownerReference) or AfterLastPod (the controller deletes it once it has
	// had pods and the last of them ended, after GracePeriodSeconds).
	// +optional
	Policy LifetimePolicy `json:"policy,omitempty"`
	// GracePeriodSeconds is how long an AfterLastPod domain waits, with no
	// pod, for a pod to come back (a restarted worker) before it is deleted:
	// 0 to 3600, default 30. Only with AfterLastPod.
	// +optional
	GracePeriodSeconds *int32 `json:"gracePeriodSeconds,omitempty"`
}

// LifetimePolicy is a ComputeDomainLifetime's policy.
type LifetimePolicy string

// The lifetime policies.
const (
	LifetimeWithOwner    LifetimePolicy = "WithOwner"
	LifetimeAfterLastPod LifetimePolicy = "AfterLastPod"
)

var lifetimePolicies = []LifetimePolicy{LifetimeWithOwner, LifetimeAfterLastPod}

// Bounds and default of GracePeriodSeconds.
const (
	DefaultGracePeriodSeconds int32 = 30
	MaxGracePeriodSeconds     int32 = 3600
)

// ComputeDomainStatus is what the driver reports about a domain: written by
// the controller from what the kubelet plugins of its nodes report.
type ComputeDomainStatus struct {
	// Nodes are the nodes with a prepared channel claim of the domain, by
	// name.
	// +optional
	// +listType=map
	// +listMapKey=name
	Nodes []ComputeDomainNode `json:"nodes,omitempty"`
	// Conditions: Ready is True when every node's daemon is connected to
	// every other node's; its reason and message say which is not and why.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Channel is the IMEX channel number the controller reserved for the
	// domain: no other live domain has it. Every channel claim of the
	// domain selects this channel, and the nodes refuse a claim of the
	// domain with another one. Unset until reserved.
	// +optional
	Channel *int32 `json:"channel,omitempty"`
}

// ComputeDomainNode is one node of a domain.
type ComputeDomainNode struct {
	// Name is the Node's name.
	Name string `json:"name"`
	// IPAddress is the address the node's IMEX daemon serves its peers on.
	// +optional
	IPAddress string `json:"ipAddress,omitempty"`
	// CliqueID is the node's NVLink clique, "<cluster UUID>.<clique ID>" as
	// its GPUs' gpu.dra.dev/cliqueID attribute says.
	// +optional
	CliqueID string `json:"cliqueID,omitempty"`
	// Channel is the IMEX channel number the domain's pods get on this node.
	// +optional
	Channel *int32 `json:"channel,omitempty"`
	// Daemon is the state of the node's IMEX daemon for the domain.
	Daemon DaemonStatus `json:"daemon"`
}

// DaemonState is the state of a node's IMEX daemon.
type DaemonState string

// The daemon states.
const (
	// DaemonStarting: started, not yet connected to every peer.
	DaemonStarting DaemonState = "Starting"
	// DaemonConnected: connected to every peer (nvidia-imex-ctl -N shows C
	// for each).
	DaemonConnected DaemonState = "Connected"
	// DaemonDisconnected: it lost, or never reached, at least one peer.
	DaemonDisconnected DaemonState = "Disconnected"
	// DaemonFailed: it could not be started or exited.
	DaemonFailed DaemonState = "Failed"
)

// DaemonStatus is a node's IMEX daemon's state and why.
type DaemonStatus struct {
	State DaemonState `json:"state"`
	// UnreachablePeers names the peers (node names) it is not connected to.
	// +optional
	UnreachablePeers []string `json:"unreachablePeers,omitempty"`
	// Message says why the daemon is not Connected.
	// +optional
	Message string `json:"message,omitempty"`
}
