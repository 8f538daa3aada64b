#!/usr/bin/env bash
# Starts a single-node Kubernetes v1.37.2 cluster on this machine from the binaries
# that hack/cluster/build.sh caches: etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd (+ Debian runc and bridge CNI) and a kubelet. Needs root.
#
# Usage: hack/cluster/up.sh [flags]
#   --state-dir DIR   state directory (env GDD_STATE_DIR, default /tmp/gdd); keep it
#                     short, unix socket paths below it must stay under 108 bytes
#   --node-name NAME  node name (env GDD_NODE_NAME, default gpu-node-0)
#   --image TAR       also import this image tar (OCI layout or docker save) into
#                     containerd's k8s.io namespace; repeatable (env GDD_IMAGES_EXTRA,
#                     space-separated)
#   --clean           tear down a cluster that is still running in the state dir
#                     first (default: refuse)
#   --no-build        do not run build.sh (env GDD_NO_BUILD=1); use what is cached
# More settings (env): GDD_APISERVER_PORT (6443), GDD_FEATURE_GATES,
#   GDD_EXTRA_FEATURE_GATES, GDD_RUNTIME_CONFIG, GDD_POD_CIDR (10.244.0.0/24),
#   GDD_SERVICE_CIDR (10.96.0.0/16), GDD_CNI_BRIDGE (gddbr0), GDD_SNAPSHOTTER
#   (auto: overlayfs when it mounts here, else native), GDD_VERBOSITY (2),
#   GDD_TIMEOUT (seconds per readiness wait, 180), GPU_DRA_CACHE (binary cache).
#
# On success it prints the admin kubeconfig path ($GDD_STATE_DIR/kubeconfig/admin.kubeconfig)
# and writes $GDD_STATE_DIR/env, to be sourced: KUBECONFIG, PATH (kubectl, helm, ctr),
# CONTAINERD_ADDRESS and CONTAINERD_NAMESPACE. Stop with hack/cluster/down.sh.
set -euo pipefail

GDD_CALLER_DIR=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=hack/cluster/config.sh
source ./config.sh
# shellcheck source=hack/cluster/pki.sh
source ./pki.sh

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
	--node-name)
		GDD_NODE_NAME=$2
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
export GDD_STATE_DIR GDD_NODE_NAME

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
	d=$(mktemp -d "$GDD_CTRD_DIR/ovl-test.XXXXXX")
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
	for p in 2379 2380 "$GDD_APISERVER_PORT" 10250 10257 10259; do
		port_free "$p" || gdd_die "port $p is in use by another process ($(ss -Hltnp "sport = :$p" | head -1))"
	done
	(("${#GDD_KUBELET_DIR}" + 60 < 108)) || gdd_die "state dir $GDD_STATE_DIR is too long for unix socket paths"
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
	start kube-scheduler "$GDD_BIN/kube-scheduler" --config="$S/kube-scheduler.yaml" \
		--authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
		--bind-address=127.0.0.1 --feature-gates="$GDD_FEATURE_GATES" --v="$GDD_VERBOSITY"
}

start_containerd() {
	mkdir -p "$GDD_CTRD_DIR" "$GDD_CNI_CONF_DIR" "$GDD_CNI_IPAM_DIR" /etc/cdi /var/run/cdi
	snapshotter=$(pick_snapshotter) # global: also written to the env file
	gdd_log "containerd snapshotter: $snapshotter"
	cat >"$GDD_CTRD_DIR/config.toml" <<EOF
version = 3
root = "$GDD_CTRD_DIR/root"
state = "$GDD_CTRD_DIR/state"
# NRI would listen on the host-global /var/run/nri/nri.sock.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "$GDD_CTRD_SOCK"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "$snapshotter"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$GDD_PAUSE_IMAGE"

[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE here: without this every sandbox fails in runc with
  # "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  # Keep network namespace mounts under the state dir instead of /var/run/netns.
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      Root = "$GDD_RUNC_ROOT"
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$GDD_CNI_CONF_DIR"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
EOF
	# ipMasq off: pods reach each other and the host, not the outside, and no
	# iptables rules are left behind when pods are removed without a CNI DEL.
	cat >"$GDD_CNI_CONF_DIR/10-gdd-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "gdd-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$GDD_CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$GDD_CNI_IPAM_DIR",
        "ranges": [[{"subnet": "$GDD_POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
	# containerd finds containerd-shim-runc-v2 on PATH and runc in /usr/sbin.
	start containerd env PATH="$GDD_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
		"$GDD_BIN/containerd" --config "$GDD_CTRD_DIR/config.toml"
	wait_for containerd "containerd serving" "$GDD_BIN/ctr" --address "$GDD_CTRD_SOCK" version

	local img
	for img in "$GDD_IMAGES/pause.tar" "$GDD_IMAGES/demo.tar" "${extra_images[@]}"; do
		"$GDD_BIN/ctr" --address "$GDD_CTRD_SOCK" -n k8s.io images import \
			--snapshotter "$snapshotter" "$img" >>"$GDD_LOGS/images.log" 2>&1 ||
			gdd_die "import $img failed; see $GDD_LOGS/images.log"
	done
	gdd_log "imported images: $("$GDD_BIN/ctr" --address "$GDD_CTRD_SOCK" -n k8s.io images ls -q 2>/dev/null | grep -v '^sha256:' | tr '\n' ' ')"
}

# expose_apiserver makes https://$GDD_SERVICE_IP:443 (the "kubernetes" Service,
# which in-cluster clients use) reach the loopback apiserver, as kube-proxy would:
# a DNAT for host-network processes (nat OUTPUT) and one for pods on the CNI bridge
# (nat PREROUTING; needs route_localnet on that bridge only). down.sh removes both.
expose_apiserver() {
	local rule
	if ! ip link show "$GDD_CNI_BRIDGE" >/dev/null 2>&1; then
		ip link add "$GDD_CNI_BRIDGE" type bridge
	fi
	ip link set "$GDD_CNI_BRIDGE" up
	sysctl -qw "net.ipv4.conf.$GDD_CNI_BRIDGE.route_localnet=1"
	while IFS= read -r rule; do
		# shellcheck disable=SC2086
		iptables -t nat -C $rule 2>/dev/null || iptables -t nat -A $rule
	done < <(gdd_apiserver_dnat_rules)
	gdd_log "in-cluster API: https://$GDD_SERVICE_IP:443 -> 127.0.0.1:$GDD_APISERVER_PORT"
}

start_kubelet() {
	mkdir -p "$GDD_KUBELET_DIR" "$S/pod-logs"
	cat >"$S/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$GDD_CTRD_SOCK
# The host is cgroup v1 (hybrid); no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
# Images are imported by hand and cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $GDD_PKI/ca.crt
authorization:
  mode: Webhook
clusterDomain: cluster.local
healthzBindAddress: 127.0.0.1
podLogsDir: $S/pod-logs
volumePluginDir: $GDD_KUBELET_DIR/volume-plugins
serializeImagePulls: false
kubeAPIQPS: 100
kubeAPIBurst: 200
featureGates:
$(feature_gates_yaml)
EOF
	start kubelet "$GDD_BIN/kubelet" --config="$S/kubelet.yaml" \
		--kubeconfig="$GDD_KUBECONFIG/kubelet.kubeconfig" \
		--root-dir="$GDD_KUBELET_DIR" --cert-dir="$GDD_KUBELET_DIR/pki" \
		--hostname-override="$GDD_NODE_NAME" --v="$GDD_VERBOSITY"
}

node_ready() {
	[[ $(kubectl get node "$GDD_NODE_NAME" \
		-o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

on_exit() {
	local rc=$?
	((rc == 0)) || gdd_log "up.sh failed; processes it started keep running: hack/cluster/down.sh --state-dir $GDD_STATE_DIR cleans up"
}

# share_state_dir puts the state dir (and so the kubelet dir) on a shared mount, as
# systemd makes / on real nodes: the kubelet allows Bidirectional and HostToContainer
# mount propagation only for host paths on shared mounts (the plugin mounts the MPS
# daemons' tmpfs through its Bidirectional data dir). down.sh unmounts it.
share_state_dir() {
	[[ $(findmnt -no PROPAGATION -M "$GDD_STATE_DIR" 2>/dev/null) == shared ]] && return
	mount --bind "$GDD_STATE_DIR" "$GDD_STATE_DIR"
	mount --make-rshared "$GDD_STATE_DIR"
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
	check_previous
	trap on_exit EXIT

	gdd_start_time=$(date +%s)
	mkdir -p "$GDD_STATE_DIR" "$GDD_LOGS" "$GDD_PIDS"
	share_state_dir
	gdd_log "state dir $GDD_STATE_DIR"
	gdd_make_pki
	export KUBECONFIG=$GDD_KUBECONFIG/admin.kubeconfig
	export PATH=$GDD_BIN:$PATH

	start_etcd
	start_apiserver
	start_controllers
	start_containerd
	expose_apiserver
	start_kubelet
	wait_for kube-controller-manager "kube-controller-manager healthy" curl -fsSk https://127.0.0.1:10257/healthz
	wait_for kube-scheduler "kube-scheduler healthy" curl -fsSk https://127.0.0.1:10259/healthz
	wait_for kubelet "node $GDD_NODE_NAME Ready" node_ready
	# Pods are rejected until the service account controller made the default account.
	wait_for kube-controller-manager "default service account" kubectl get serviceaccount default -n default

	cat >"$S/env" <<EOF
export KUBECONFIG=$KUBECONFIG
export PATH=$GDD_BIN:\$PATH
export CONTAINERD_ADDRESS=$GDD_CTRD_SOCK
export CONTAINERD_NAMESPACE=k8s.io
export CONTAINERD_SNAPSHOTTER=$snapshotter
EOF
	gdd_log "cluster up in $(($(date +%s) - gdd_start_time))s (with build check: $(($(date +%s) - t0))s)"
	cat >&2 <<EOF

  Kubernetes $GDD_K8S_VERSION single-node cluster, node $GDD_NODE_NAME
  admin kubeconfig: $KUBECONFIG
  kubelet root dir: $GDD_KUBELET_DIR (plugins/, plugins_registry/)
  CDI spec dirs:    /etc/cdi /var/run/cdi
  logs:             $GDD_LOGS
  feature gates:    $GDD_FEATURE_GATES
  runtime config:   $GDD_RUNTIME_CONFIG

  source $S/env     # KUBECONFIG, PATH with kubectl/helm/ctr, CONTAINERD_ADDRESS
  hack/cluster/down.sh${GDD_STATE_DIR:+ --state-dir $GDD_STATE_DIR}

EOF
	echo "$KUBECONFIG"
}

main
