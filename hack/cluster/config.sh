# shellcheck shell=bash disable=SC2034 # variables are used by the scripts that source this
# Settings of a local cluster run, shared by up.sh, down.sh and smoke.sh. Sourced.
# Every setting is an environment variable with a default; up.sh/down.sh flags set
# the same variables.

# shellcheck source=hack/cluster/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# gdd_abs makes a path given by the user absolute, relative to the directory the script
# was started from (GDD_CALLER_DIR, set before the scripts cd to their own directory).
gdd_abs() {
	case $1 in
	/*) realpath -m -- "$1" ;;
	*) realpath -m -- "${GDD_CALLER_DIR:-$PWD}/$1" ;;
	esac
}

# gdd_set_state_dir derives every path from the state directory. Unix socket paths
# must stay below 108 bytes, so the state directory has to be short.
gdd_set_state_dir() {
	GDD_STATE_DIR=$(gdd_abs "$1")
	S=$GDD_STATE_DIR
	GDD_PKI=$S/pki
	GDD_KUBECONFIG=$S/kubeconfig
	GDD_LOGS=$S/logs
	GDD_PIDS=$S/pids
	GDD_ETCD_DIR=$S/etcd
	# Each node's files live in $S/nodes/<name> (the host's view). Inside its own
	# mount namespace a node sees that directory at $S/node and nothing of the
	# other nodes, so every node-local path below is the same on every node, as
	# /var/lib/kubelet is on real machines (hack/cluster/node.sh).
	GDD_NODES_DIR=$S/nodes
	GDD_NODE_LOCAL=$S/node
	GDD_CTRD_DIR=$GDD_NODE_LOCAL/containerd
	GDD_CTRD_SOCK=$GDD_CTRD_DIR/containerd.sock
	GDD_RUNC_ROOT=$GDD_CTRD_DIR/runc
	GDD_KUBELET_DIR=$GDD_NODE_LOCAL/kubelet
	GDD_CNI_CONF_DIR=$GDD_NODE_LOCAL/cni/net.d
	GDD_CNI_IPAM_DIR=$GDD_NODE_LOCAL/cni/ipam
}

# gdd_node_dir NAME prints the host's view of node NAME's directory; gdd_host_path
# NAME PATH turns a node-local PATH (below $GDD_NODE_LOCAL) into the host's view.
gdd_node_dir() { echo "$GDD_NODES_DIR/$1"; }
gdd_host_path() { echo "$GDD_NODES_DIR/$1${2#"$GDD_NODE_LOCAL"}"; }

gdd_set_state_dir "${GDD_STATE_DIR:-/tmp/gdd}"
# GDD_NODES nodes named ${GDD_NODE_PREFIX}0.. each run a kubelet and a containerd in
# their own mount, network, UTS and IPC namespaces (hack/cluster/node.sh).
GDD_NODES=${GDD_NODES:-1}
GDD_NODE_PREFIX=${GDD_NODE_PREFIX:-gpu-node-}
# The nodes' network: a host bridge with GDD_HOST_IP, node i at .(10+i) and its
# pods in 10.244.i.0/24 (routed through the host).
GDD_HOST_BRIDGE=${GDD_HOST_BRIDGE:-gddnet0}
GDD_NODE_NET=${GDD_NODE_NET:-10.250.0}
GDD_HOST_IP=$GDD_NODE_NET.1
GDD_POD_NET=${GDD_POD_NET:-10.244}
GDD_MAX_NODES=16
gdd_node_name() { echo "$GDD_NODE_PREFIX$1"; }
gdd_node_ip() { echo "$GDD_NODE_NET.$((10 + $1))"; }
gdd_pod_cidr() { echo "$GDD_POD_NET.$1.0/24"; }
# gdd_node_names prints every node's name, one per line.
gdd_node_names() {
	local i
	for ((i = 0; i < GDD_NODES; i++)); do gdd_node_name "$i"; done
}
GDD_APISERVER_PORT=${GDD_APISERVER_PORT:-6443}
GDD_SERVICE_CIDR=${GDD_SERVICE_CIDR:-10.96.0.0/16}
# gdd_first_ip CIDR prints the first host address of an IPv4 CIDR: the ClusterIP of
# the "kubernetes" Service.
gdd_first_ip() {
	local ip=${1%/*} bits=${1#*/} a b c d n
	IFS=. read -r a b c d <<<"$ip"
	n=$(((a << 24 | b << 16 | c << 8 | d) & (0xffffffff << (32 - bits)) & 0xffffffff))
	n=$((n + 1))
	echo "$((n >> 24 & 255)).$((n >> 16 & 255)).$((n >> 8 & 255)).$((n & 255))"
}
GDD_SERVICE_IP=$(gdd_first_ip "$GDD_SERVICE_CIDR")
GDD_CNI_BRIDGE=${GDD_CNI_BRIDGE:-gddbr0}
GDD_SNAPSHOTTER=${GDD_SNAPSHOTTER:-auto}
GDD_CDI_PREFIX=${GDD_CDI_PREFIX:-k8s.gpu.dra.dev}
GDD_VERBOSITY=${GDD_VERBOSITY:-2}
GDD_TIMEOUT=${GDD_TIMEOUT:-180}

# GenericWorkload (beta, off by default in 1.37): Workload and PodGroup API
# (scheduling.k8s.io/v1beta1) plus the GangScheduling and PodGroupPodsCount
# scheduler plugins and the PodGroup protection controller.
# DRAWorkloadResourceClaims (beta, off by default): ResourceClaims reserved for and
# shared by a whole PodGroup. DynamicResourceAllocation and DRAExtendedResource are
# GA and locked on in 1.37, so they are not listed.
GDD_FEATURE_GATES=${GDD_FEATURE_GATES:-GenericWorkload=true,DRAWorkloadResourceClaims=true}
if [[ -n ${GDD_EXTRA_FEATURE_GATES:-} ]]; then
	GDD_FEATURE_GATES=$GDD_FEATURE_GATES,$GDD_EXTRA_FEATURE_GATES
fi
# Beta API versions are off by default: serve the Workload/PodGroup API.
GDD_RUNTIME_CONFIG=${GDD_RUNTIME_CONFIG:-scheduling.k8s.io/v1beta1=true}

# The kube-scheduler binary: the cached one, or the one in GDD_SCHEDULER_BIN_DIR
# (a kube-scheduler built otherwise, e.g. by hack/upstream-allocator/build.sh).
GDD_SCHEDULER=${GDD_SCHEDULER_BIN_DIR:-$GDD_BIN}/kube-scheduler

# The control plane's components, in start order; each node adds its containerd
# and kubelet.
GDD_COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)

# gdd_pid NAME [PIDS-DIR] prints the PID of a component of this state dir if it
# still runs the expected binary (guards against PID reuse), and fails otherwise.
gdd_pid() {
	local name=$1 pid exe
	pid=$(cat "${2:-$GDD_PIDS}/$name.pid" 2>/dev/null) || return 1
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
	[[ $(basename "${exe% (deleted)}") == "$name" ]]
	echo "$pid"
}

# gdd_apiserver_dnat_rules prints the host's iptables nat rules (without -A/-D)
# that up.sh adds and down.sh removes, one per line: the "kubernetes" Service for
# host processes, and the nodes' way to the loopback API server.
gdd_apiserver_dnat_rules() {
	local c="-m comment --comment gdd-apiserver:$GDD_STATE_DIR"
	local to="-j DNAT --to-destination 127.0.0.1:$GDD_APISERVER_PORT"
	echo "OUTPUT -d $GDD_SERVICE_IP/32 -p tcp --dport 443 $c $to"
	echo "PREROUTING -i $GDD_HOST_BRIDGE -d $GDD_HOST_IP/32 -p tcp --dport $GDD_APISERVER_PORT $c $to"
}
