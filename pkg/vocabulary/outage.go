package vocabulary

// Names of the outage detection (docs/operations.md, "Outage"): each node's
// plugin renews a heartbeat Lease while its DRA service answers, and
// dra-controller taints the node's devices with a DeviceTaintRule when the
// renewals lapse. The chart's admission policy spells the Lease prefix out
// too (a test checks it is this one).
const (
	// HeartbeatLeasePrefix precedes the node name in the name of the node's
	// heartbeat Lease, in the plugin's namespace.
	HeartbeatLeasePrefix = "gpu-dra-heartbeat-"
	// LabelHeartbeat, with value "true", marks the heartbeat Leases.
	LabelHeartbeat = DriverName + "/heartbeat"

	// OutageRulePrefix precedes the node name in the name of the
	// DeviceTaintRule that taints the devices of a node whose plugin does
	// not serve.
	OutageRulePrefix = "gpu-dra-outage-"
	// LabelOutage, with value "true", marks those DeviceTaintRules.
	LabelOutage = DriverName + "/outage"
	// OutageTaintKey and OutageTaintValue are the taint those rules apply;
	// a claim tolerates it with key gpu.dra.dev/outage.
	OutageTaintKey   = DriverName + "/outage"
	OutageTaintValue = "plugin-not-serving"
	// AnnotationOutageRenewTime and AnnotationOutageHolder record on an
	// outage rule the heartbeat Lease's renewTime (RFC 3339, microseconds;
	// "" when never renewed) and holder it was made for: a restarted or newly
	// elected controller keeps the rule until the Lease shows another renewal.
	AnnotationOutageRenewTime = DriverName + "/outage-lease-renew-time"
	AnnotationOutageHolder    = DriverName + "/outage-lease-holder"
)

// HeartbeatLeaseName is the name of node's heartbeat Lease. A node name is
// a DNS subdomain, and so is the result when it fits 253 characters.
func HeartbeatLeaseName(node string) string { return HeartbeatLeasePrefix + node }

// OutageRuleName is the name of node's outage DeviceTaintRule.
func OutageRuleName(node string) string { return OutageRulePrefix + node }
