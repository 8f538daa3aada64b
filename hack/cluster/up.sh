#!/usr/bin/env bash
# Starts a Kubernetes v1.37.2 cluster of one or more nodes on this machine from the
# binaries that hack/cluster/build.sh caches: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler on the host, and per node a containerd
# (+ Debian runc and bridge CNI) and a kubelet in the node's own mount, network,
# UTS and IPC namespaces (hack/cluster/node.sh). Needs root.
#
# Usage: hack/cluster/up.sh [flags]
#   --state-dir DIR   state directory (env GDD_STATE_DIR, default /tmp/gdd); keep it
#                     short, unix socket paths below it must stay under 108 bytes
#   --nodes N         number of nodes (env GDD_NODES, default 1), named
#                     gpu-node-0.. (env GDD_NODE_PREFIX); at most 16
#   --image TAR       also import this image tar (OCI layout or docker save) into
#                     containerd's k8s.io namespace; repeatable (env GDD_IMAGES_EXTRA,
#                     space-separated)
#   --clean           tear down a cluster that is still running in the state dir
#                     first (default: refuse)
#   --no-build        do not run build.sh (env GDD_NO_BUILD=1); use what is cached
# More settings (env): GDD_APISERVER_PORT (6443), GDD_FEATURE_GATES,
#   GDD_EXTRA_FEATURE_GATES, GDD_RUNTIME_CONFIG, GDD_NODE_NET (10.250.0: host .1,
#   node i .10+i), GDD_POD_NET (10.244: node i's pods in 10.244.i.0/24),
#   GDD_SERVICE_CIDR (10.96.0.0/16), GDD_HOST_BRIDGE (gddnet0), GDD_CNI_BRIDGE
#   (gddbr0, inside each node), GDD_SNAPSHOTTER
#   (auto: overlayfs when it mounts here, else native), GDD_VERBOSITY (2),
#   GDD_TIMEOUT (seconds per readiness wait, 180), GPU_DRA_CACHE (binary cache),
#   GDD_SCHEDULER_BIN_DIR (run the kube-scheduler of this directory instead of the
#   cached one, e.g. hack/upstream-allocator/build.sh --print-bin-dir).
#
# On success it prints the admin kubeconfig path ($GDD_STATE_DIR/kubeconfig/admin.kubeconfig)
# and writes $GDD_STATE_DIR/env, to be sourced: KUBECONFIG, PATH (kubectl, helm, ctr),
# CONTAINERD_ADDRESS (the first node's) and CONTAINERD_NAMESPACE, GDD_NODE_NAMES and
# GDD_CONTAINERD_ADDRESSES (every node's, space-separated). hack/cluster/enter.sh
# runs a command on a node. Stop with hack/cluster/down.sh.
set -euo pipefail

GDD_CALLER_DIR=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/config.sh
source ./config.sh
# shellcheck source=hack/cluster/pki.sh
source ./pki.sh
# shellcheck source=hack/cluster/node.sh
source ./node.sh

clean=false
build=true
[[ ${GDD_NO_BUILD:-} == 1 ]] && build=false
extra_images=()
for img in ${GDD_IMAGES_EXTRA:-}; do
	extra_images+=("$(gdd_abs "$img")")
done
while (($#)); do
	case $1 in
	--state-dir)
		gdd_set_state_dir "$2"
		shift
		;;
	--nodes)
		GDD_NODES=$2
		shift
		;;
	--image)
		extra_images+=("$(gdd_abs "$2")")
		[[ -e ${extra_images[-1]} ]] || gdd_die "--image $2: ${extra_images[-1]} does not exist"
		shift
		;;
	--clean) clean=true ;;
	--no-build) build=false ;;
	-h | --help)
		gdd_usage
		exit 0
		;;
	*) gdd_die "unknown argument $1 (see --help)" ;;
	esac
	shift
done
export GDD_STATE_DIR GDD_NODES
if ! [[ $GDD_NODES =~ ^[0-9]+$ ]] || ((GDD_NODES < 1 || GDD_NODES > GDD_MAX_NODES)); then
	gdd_die "--nodes/GDD_NODES=$GDD_NODES: want a number from 1 to $GDD_MAX_NODES"
fi

[[ $(id -u) == 0 ]] || gdd_die "up.sh needs root (kubelet, containerd, mounts, network namespaces)"

# start NAME CMD...: runs CMD detached in its own session, logging to logs/NAME.log.
start() {
	local name=$1
	shift
	setsid "$@" >"$GDD_LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$GDD_PIDS/$name.pid"
	gdd_log "started $name (pid $!, log $GDD_LOGS/$name.log)"
}

# wait_for NAME WHAT CMD...: polls CMD until it succeeds; fails early when the
# process NAME died, showing the end of its log.
wait_for() {
	local name=$1 what=$2 t0 pid
	shift 2
	t0=$(date +%s)
	pid=$(cat "$GDD_PIDS/$name.pid")
	until "$@" >/dev/null 2>&1; do
		# Not gdd_pid: right after start the PID may still be setsid or env.
		if [[ ! -e /proc/$pid || $(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null) == Z ]]; then
			tail -n 30 "$GDD_LOGS/$name.log" >&2 || true
			gdd_die "$name exited while waiting for $what; log: $GDD_LOGS/$name.log"
		fi
		if (($(date +%s) - t0 > GDD_TIMEOUT)); then
			tail -n 30 "$GDD_LOGS/$name.log" >&2 || true
			gdd_die "timed out after ${GDD_TIMEOUT}s waiting for $what; log: $GDD_LOGS/$name.log"
		fi
		sleep 0.5
	done
	gdd_log "$what ($(($(date +%s) - t0))s)"
}

port_free() {
	[[ -z $(ss -Hltn "sport = :$1") ]]
}

# feature_gates_yaml prints GDD_FEATURE_GATES as the body of a YAML map.
feature_gates_yaml() {
	local kv kvs
	IFS=, read -r -a kvs <<<"$GDD_FEATURE_GATES"
	for kv in "${kvs[@]}"; do
		if [[ -n $kv ]]; then
			printf '  %s: %s\n' "${kv%%=*}" "${kv#*=}"
		fi
	done
}

pick_snapshotter() {
	[[ $GDD_SNAPSHOTTER != auto ]] && {
		echo "$GDD_SNAPSHOTTER"
		return
	}
	local d
	d=$(mktemp -d "$GDD_STATE_DIR/ovl-test.XXXXXX")
	mkdir -p "$d"/{l,u,w,m}
	if mount -t overlay overlay -o "lowerdir=$d/l,upperdir=$d/u,workdir=$d/w" "$d/m" 2>/dev/null; then
		umount "$d/m"
		echo overlayfs
	else
		echo native
	fi
	rm -rf "$d"
}

# --- previous runs ----------------------------------------------------------------
check_previous() {
	local c running=()
	for c in "${GDD_COMPONENTS[@]}"; do
		gdd_pid "$c" >/dev/null && running+=("$c")
	done
	for c in "$GDD_NODES_DIR"/*/pids/ns.pid; do
		[[ -e $c ]] || continue
		c=$(basename "$(dirname "$(dirname "$c")")")
		gdd_node_ns_pid "$c" >/dev/null && running+=("node $c")
	done
	if ((${#running[@]})); then
		$clean || gdd_die "a cluster is running in $GDD_STATE_DIR (${running[*]}); run hack/cluster/down.sh or pass --clean"
		gdd_log "tearing down the running cluster in $GDD_STATE_DIR (--clean)"
		./down.sh --state-dir "$GDD_STATE_DIR"
	elif [[ -n $(find "$GDD_STATE_DIR" -mindepth 1 -maxdepth 1 ! -name logs 2>/dev/null) ]]; then
		gdd_log "cleaning up after an earlier run that was not shut down with down.sh"
		./down.sh --state-dir "$GDD_STATE_DIR" --quiet
	fi
	rm -rf "$GDD_LOGS" # from the previous run
	local p
	for p in 2379 2380 "$GDD_APISERVER_PORT" 10257 10259; do
		port_free "$p" || gdd_die "port $p is in use by another process ($(ss -Hltnp "sport = :$p" | head -1))"
	done
	(("${#GDD_KUBELET_DIR}" + 60 < 108)) || gdd_die "state dir $GDD_STATE_DIR is too long for unix socket paths"
	! ip link show "$GDD_HOST_BRIDGE" >/dev/null 2>&1 || gdd_die "bridge $GDD_HOST_BRIDGE exists: another cluster runs (or run hack/cluster/down.sh)"
}

# --- components ---------------------------------------------------------------------
start_etcd() {
	start etcd "$GDD_BIN/etcd" --data-dir "$GDD_ETCD_DIR" --unsafe-no-fsync
	wait_for etcd "etcd healthy" curl -fsS http://127.0.0.1:2379/health
}

start_apiserver() {
	local p=$GDD_PKI
	start kube-apiserver "$GDD_BIN/kube-apiserver" \
		--etcd-servers=http://127.0.0.1:2379 \
		--bind-address=127.0.0.1 --secure-port="$GDD_APISERVER_PORT" \
		--tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
		--client-ca-file="$p/ca.crt" \
		--kubelet-client-certificate="$p/apiserver-kubelet-client.crt" \
		--kubelet-client-key="$p/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types=InternalIP,Hostname \
		--requestheader-client-ca-file="$p/ca.crt" --requestheader-allowed-names=front-proxy-client \
		--requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
		--requestheader-extra-headers-prefix=X-Remote-Extra- \
		--proxy-client-cert-file="$p/front-proxy-client.crt" --proxy-client-key-file="$p/front-proxy-client.key" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
		--service-cluster-ip-range="$GDD_SERVICE_CIDR" \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--allow-privileged=true --enable-aggregator-routing=true \
		--feature-gates="$GDD_FEATURE_GATES" --runtime-config="$GDD_RUNTIME_CONFIG" \
		--v="$GDD_VERBOSITY"
	wait_for kube-apiserver "kube-apiserver ready" \
		curl -fsS --cacert "$p/ca.crt" --cert "$p/admin.crt" --key "$p/admin.key" \
		"https://127.0.0.1:$GDD_APISERVER_PORT/readyz"
}

start_controllers() {
	local p=$GDD_PKI kc=$GDD_KUBECONFIG/controller-manager.kubeconfig
	start kube-controller-manager "$GDD_BIN/kube-controller-manager" \
		--kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
		--bind-address=127.0.0.1 --leader-elect=false \
		--service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
		--cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
		--use-service-account-credentials=true --controllers='*' \
		--kube-api-qps=1000 --kube-api-burst=1000 \
		--feature-gates="$GDD_FEATURE_GATES" --v="$GDD_VERBOSITY"

	kc=$GDD_KUBECONFIG/scheduler.kubeconfig
	cat >"$S/kube-scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $kc
  qps: 1000
  burst: 1000
leaderElection:
  leaderElect: false
EOF
	start kube-scheduler "$GDD_SCHEDULER" --config="$S/kube-scheduler.yaml" \
		--authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
		--bind-address=127.0.0.1 --feature-gates="$GDD_FEATURE_GATES" --v="$GDD_VERBOSITY"
}

# host_network makes the host bridge the nodes hang on and lets them (and host
# processes, through the "kubernetes" Service IP, as kube-proxy would) reach the
# loopback API server: DNAT rules, route_localnet on that bridge only. down.sh
# removes both.
host_network() {
	local rule
	ip link add "$GDD_HOST_BRIDGE" type bridge
	ip addr add "$GDD_HOST_IP/24" dev "$GDD_HOST_BRIDGE"
	ip link set "$GDD_HOST_BRIDGE" up
	sysctl -qw "net.ipv4.conf.$GDD_HOST_BRIDGE.route_localnet=1"
	# Pods on different nodes need the host to route between the nodes' subnets.
	# A fresh machine may have forwarding off: turn it on and leave a note for
	# down.sh, which turns it off again.
	if [[ $(sysctl -n net.ipv4.ip_forward) != 1 ]]; then
		echo 0 >"$GDD_STATE_DIR/ip_forward.restore"
		sysctl -qw net.ipv4.ip_forward=1
		gdd_log "net.ipv4.ip_forward was 0: set to 1 while the cluster runs (down.sh sets it back)"
	fi
	while IFS= read -r rule; do
		# shellcheck disable=SC2086
		iptables -t nat -C $rule 2>/dev/null || iptables -t nat -A $rule
	done < <(gdd_apiserver_dnat_rules)
	gdd_log "nodes' network: bridge $GDD_HOST_BRIDGE $GDD_HOST_IP/24; API https://$GDD_HOST_IP:$GDD_APISERVER_PORT and https://$GDD_SERVICE_IP:443"
}

nodes_ready() {
	local n
	n=$(kubectl get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null | grep -c '^True$')
	((n == GDD_NODES))
}

on_exit() {
	local rc=$?
	((rc == 0)) || gdd_log "up.sh failed; processes it started keep running: hack/cluster/down.sh --state-dir $GDD_STATE_DIR cleans up"
}

main() {
	local t0
	t0=$(date +%s)
	if $build; then
		./build.sh
	fi
	local b
	for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl containerd \
		containerd-shim-runc-v2 ctr; do
		[[ -x $GDD_BIN/$b ]] || gdd_die "$GDD_BIN/$b missing; run hack/cluster/build.sh"
	done
	[[ -x $GDD_SCHEDULER ]] || gdd_die "$GDD_SCHEDULER missing (GDD_SCHEDULER_BIN_DIR=${GDD_SCHEDULER_BIN_DIR:-})"
	[[ $GDD_SCHEDULER == "$GDD_BIN/kube-scheduler" ]] || gdd_log "kube-scheduler: $GDD_SCHEDULER"
	check_previous
	trap on_exit EXIT

	gdd_start_time=$(date +%s)
	mkdir -p "$GDD_STATE_DIR" "$GDD_LOGS" "$GDD_PIDS" "$GDD_NODES_DIR"
	gdd_log "state dir $GDD_STATE_DIR, $GDD_NODES node(s)"
	host_network
	gdd_make_pki
	export KUBECONFIG=$GDD_KUBECONFIG/admin.kubeconfig
	export PATH=$GDD_BIN:$PATH
	snapshotter=$(pick_snapshotter) # global: node.sh and the env file use it
	gdd_log "containerd snapshotter: $snapshotter"

	start_etcd
	start_apiserver
	start_controllers
	local i names=() socks=()
	for ((i = 0; i < GDD_NODES; i++)); do
		names+=("$(gdd_node_name "$i")")
		socks+=("$(gdd_host_path "${names[i]}" "$GDD_CTRD_SOCK")")
		node_ns_create "$i"
		node_containerd "$i"
		node_kubelet "$i"
	done
	wait_for kube-controller-manager "kube-controller-manager healthy" curl -fsSk https://127.0.0.1:10257/healthz
	wait_for kube-scheduler "kube-scheduler healthy" curl -fsSk https://127.0.0.1:10259/healthz
	wait_for kube-apiserver "$GDD_NODES node(s) Ready" nodes_ready
	# Pods are rejected until the service account controller made the default account.
	wait_for kube-controller-manager "default service account" kubectl get serviceaccount default -n default

	cat >"$S/env" <<EOF
export KUBECONFIG=$KUBECONFIG
export PATH=$GDD_BIN:\$PATH
export CONTAINERD_ADDRESS=${socks[0]}
export CONTAINERD_NAMESPACE=k8s.io
export CONTAINERD_SNAPSHOTTER=$snapshotter
export GDD_NODE_NAMES="${names[*]}"
export GDD_CONTAINERD_ADDRESSES="${socks[*]}"
EOF
	gdd_log "cluster up in $(($(date +%s) - gdd_start_time))s (with build check: $(($(date +%s) - t0))s)"
	cat >&2 <<EOF

  Kubernetes $GDD_K8S_VERSION cluster, nodes ${names[*]}
  admin kubeconfig: $KUBECONFIG
  on each node (own mount namespace; host view $GDD_NODES_DIR/<node>):
    kubelet root dir: $GDD_KUBELET_DIR (plugins/, plugins_registry/)
    CDI spec dirs:    /etc/cdi /var/run/cdi
  logs:             $GDD_LOGS (<node>/kubelet.log, <node>/containerd.log)
  feature gates:    $GDD_FEATURE_GATES
  runtime config:   $GDD_RUNTIME_CONFIG

  source $S/env     # KUBECONFIG, PATH with kubectl/helm/ctr, CONTAINERD_ADDRESS
  hack/cluster/enter.sh ${names[0]} [CMD]   # a shell (or CMD) on a node
  hack/cluster/down.sh${GDD_STATE_DIR:+ --state-dir $GDD_STATE_DIR}

EOF
	echo "$KUBECONFIG"
}

main
